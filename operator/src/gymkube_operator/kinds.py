"""Building blocks shared by gymkube resource models: camelCase keys, quantities, free-form maps."""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

GROUP = "gymkube.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubernetes quantities are ints or strings ("500m", "8Gi"); the API server keeps them as written.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

# Partial Kubernetes objects (pod spec overrides) are validated by the API server when the
# children are applied, so the CRD keeps them as-is instead of copying the whole PodSpec schema.
FreeForm = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def validation_rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL (rule, message) pairs as x-kubernetes-validations, checked by the API server."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


class CamelModel(BaseModel):
    """A resource model whose JSON keys are camelCase, as Kubernetes users write them."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    def to_api(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ResourceRequirements(CamelModel):
    """Requests and limits of one container, as in a Kubernetes container spec."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: '2', memory: 4Gi}."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. {memory: 8Gi}."
    )
