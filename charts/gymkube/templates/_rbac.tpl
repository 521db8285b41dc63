{{- /*
Everything the operator does, and nothing more. Cluster mode (no watchNamespaces): one ClusterRole.
Namespaced mode: the same rules in a Role per watched namespace, and no cluster-wide permission.
"Server-side applied" needs two verbs: create for an object that does not exist yet, patch after.
tests/integration/test_packaging.py checks these rules against the operator's needs.
*/}}
{{- define "gymkube.operatorRules" -}}
# kopf watches EnvPools and TrainingRuns and patches its finalizer and progress annotations onto
# them; a TrainingRun reads the EnvPool it names.
- apiGroups: ["gymkube.io"]
  resources: ["envpools", "trainingruns"]
  verbs: ["get", "list", "watch", "patch"]
# A finished TrainingRun with ttlSecondsAfterFinished deletes itself.
- apiGroups: ["gymkube.io"]
  resources: ["trainingruns"]
  verbs: ["delete"]
# Conditions, replica counts, the pool URL, restarts and preflight results.
- apiGroups: ["gymkube.io"]
  resources: ["envpools/status", "trainingruns/status"]
  verbs: ["patch"]
# Children carry blockOwnerDeletion owner references; clusters that enforce owner-reference
# permissions (the OwnerReferencesPermissionEnforcement admission plugin) require this.
- apiGroups: ["gymkube.io"]
  resources: ["envpools/finalizers", "trainingruns/finalizers"]
  verbs: ["update"]
# An EnvPool's env-server StatefulSet and router Deployment: server-side applied, and indexed and
# watched to compute the pool's status.
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["list", "watch", "create", "patch"]
# The pool and backends Services, and a TrainingRun's agent-loop ConfigMap: server-side applied.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["create", "patch"]
# An EnvPool's PodDisruptionBudget: server-side applied.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
# An EnvPool's NetworkPolicy (networkPolicy.enabled): server-side applied; read and deleted to
# remove the pool's own policy when the operator runs with policies turned off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
# The watchdog indexes env-server pods and deletes hung or worn-out ones (their StatefulSet
# recreates them); a TrainingRun lists its Job's pods to report why they failed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# A running TrainingRun reads the tail of its trainer's log for the progress lines it prints.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Preflight and training Jobs (one node) and RayJobs (several nodes): server-side applied, read
# back, watched for completion, and patched to suspend or resume them.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# kopf and the operator report transitions as Events on the EnvPool or TrainingRun; the watchdog
# lists the Events of an env-server pod restarted and not up again (a startup-probe kill shows only
# there).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}
