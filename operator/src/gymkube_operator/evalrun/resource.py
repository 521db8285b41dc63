"""The EvalRun CRD: names, printer columns and subresources around the generated schema."""

from gymkube_operator.crds import CustomResource, PrinterColumn
from gymkube_operator.evalrun.models import KIND, PLURAL, EvalRunSpec, EvalRunStatus
from gymkube_operator.trainingrun.resource import MAX_NAME

EVALRUN = CustomResource(
    kind=KIND,
    plural=PLURAL,
    short_names=("evr",),
    spec=EvalRunSpec,
    status=EvalRunStatus,
    description="A model's score on held-out episodes of one EnvPool, played as training plays.",
    rules=(
        (
            f"self.metadata.name.size() <= {MAX_NAME}",
            f"EvalRun names are at most {MAX_NAME} characters: they prefix Job and pod names",
        ),
    ),
    columns=(
        PrinterColumn(
            "Model", "string", ".status.model", "The model path, or <trainingrun>@<step>"
        ),
        PrinterColumn("Pool", "string", ".spec.envPoolRef.name", "The EnvPool played"),
        PrinterColumn("Phase", "string", ".status.phase", "Where the eval is"),
        PrinterColumn("Episodes", "integer", ".status.progress.episodes", "Episodes played"),
        PrinterColumn("Total", "integer", ".status.progress.total", "Episodes to play"),
        PrinterColumn(
            "Score", "number", ".status.progress.meanScore", "Mean normalised episode reward (0..1)"
        ),
        PrinterColumn(
            "Success", "number", ".status.result.successRate", "Episodes that succeeded", 1
        ),
        PrinterColumn("Step", "integer", ".status.result.checkpointStep", "Checkpoint step", 1),
        PrinterColumn("Job", "string", ".status.job", "The eval Job", 1),
        PrinterColumn(
            "Reason",
            "string",
            ".status.conditions[?(@.type=='Failed')].reason",
            "Why the eval failed",
            1,
        ),
    ),
)
