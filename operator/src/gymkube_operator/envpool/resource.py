"""The EnvPool CRD: names, printer columns and subresources around the generated schema."""

from gymkube_operator.crds import CustomResource, PrinterColumn
from gymkube_operator.envpool.models import KIND, PLURAL, EnvPoolSpec, EnvPoolStatus

# The pool name prefixes StatefulSet pods (whose revision label must stay within 63 characters)
# and Services (DNS-1035 labels), so it is a short DNS-1035 label.
MAX_NAME = 40

ENVPOOL = CustomResource(
    kind=KIND,
    plural=PLURAL,
    short_names=("envp",),
    spec=EnvPoolSpec,
    status=EnvPoolStatus,
    description="A pool of gymkube env servers behind one session-router URL.",
    rules=(
        (
            f"self.metadata.name.size() <= {MAX_NAME}",
            f"EnvPool names are at most {MAX_NAME} characters: they prefix pod and Service names",
        ),
        (
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "EnvPool names must start with a letter and hold only lowercase letters, digits, '-'",
        ),
    ),
    scale=(".spec.replicas", ".status.replicas", ".status.selector"),
    columns=(
        PrinterColumn("Ready", "integer", ".status.readyReplicas", "Ready env-server pods"),
        PrinterColumn("Replicas", "integer", ".spec.replicas", "Wanted env-server pods", 1),
        PrinterColumn("Sessions", "integer", ".status.activeSessions", "Open sessions"),
        PrinterColumn("Capacity", "integer", ".status.capacity", "Sessions the pool can hold"),
        PrinterColumn(
            "Health",
            "string",
            ".status.conditions[?(@.type=='Degraded')].reason",
            "Healthy, or why the pool is Degraded",
        ),
        PrinterColumn("URL", "string", ".status.url", "The pool URL"),
        PrinterColumn("Env", "string", ".spec.env", "Env served", 1),
        PrinterColumn(
            "Status", "string", ".status.conditions[?(@.type=='Ready')].reason", "Why", 1
        ),
    ),
)
