"""The TrainingRun CRD: names, printer columns and subresources around the generated schema."""

from gymkube_operator.crds import CustomResource, PrinterColumn
from gymkube_operator.trainingrun.models import KIND, PLURAL, TrainingRunSpec, TrainingRunStatus

# The run name prefixes its Jobs, ConfigMap and (for RayJobs) KubeRay's RayCluster and pod names,
# which must stay valid 63-character label values.
MAX_NAME = 40

TRAININGRUN = CustomResource(
    kind=KIND,
    plural=PLURAL,
    short_names=("tr",),
    spec=TrainingRunSpec,
    status=TrainingRunStatus,
    description="A verl training job whose agent loop plays the envs of one EnvPool.",
    rules=(
        (
            f"self.metadata.name.size() <= {MAX_NAME}",
            f"TrainingRun names are at most {MAX_NAME} characters: they prefix Job and pod names",
        ),
        (
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "TrainingRun names must start with a letter and hold only lowercase letters, "
            "digits and '-'",
        ),
    ),
    columns=(
        PrinterColumn("Pool", "string", ".spec.envPoolRef.name", "The EnvPool played"),
        PrinterColumn("Phase", "string", ".status.phase", "Where the run is"),
        PrinterColumn("Nodes", "integer", ".spec.nodes", "Trainer nodes"),
        PrinterColumn("Step", "integer", ".status.progress.step", "Training steps done"),
        PrinterColumn("Total", "integer", ".status.progress.totalSteps", "Training steps in all"),
        PrinterColumn("Reward", "number", ".status.progress.meanReward", "Last step's mean reward"),
        PrinterColumn("ETA", "number", ".status.progress.etaSeconds", "Estimated seconds left"),
        PrinterColumn(
            "Restarts", "integer", ".status.restarts.count", "Trainer pods the Job replaced"
        ),
        PrinterColumn("Device", "string", ".spec.device", "gpu or cpu", 1),
        PrinterColumn("GPUs", "integer", ".spec.gpusPerNode", "GPUs per node", 1),
        PrinterColumn("Algorithm", "string", ".spec.algorithm", "verl adv_estimator", 1),
        PrinterColumn("Child", "string", ".status.training.name", "Training Job or RayJob", 1),
        PrinterColumn(
            "Reason",
            "string",
            ".status.conditions[?(@.type=='Failed')].reason",
            "Why the run failed",
            1,
        ),
    ),
)
