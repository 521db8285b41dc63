{{- /*
Everything the operator does, and nothing more. Cluster mode (no watchNamespaces): one ClusterRole.
Namespaced mode: the same rules in a Role per watched namespace, and no cluster-wide permission.
"Server-side applied" needs two verbs: create for an object that does not exist yet, patch after.
tests/integration/test_packaging.py checks these rules against the operator's needs.
*/}}
{{- define "gymkube.operatorRules" -}}
# kopf watches EnvPools, TrainingRuns and EvalRuns and patches its finalizer and progress
# annotations onto them; a TrainingRun or EvalRun reads the EnvPool it names, and an EvalRun the
# TrainingRun whose checkpoint it scores.
- apiGroups: ["gymkube.io"]
  resources: ["envpools", "trainingruns", "evalruns"]
  verbs: ["get", "list", "watch", "patch"]
# A finished TrainingRun or EvalRun with ttlSecondsAfterFinished deletes itself.
- apiGroups: ["gymkube.io"]
  resources: ["trainingruns", "evalruns"]
  verbs: ["delete"]
# Conditions, replica counts, the pool URL, restarts, preflight results and eval scores.
- apiGroups: ["gymkube.io"]
  resources: ["envpools/status", "trainingruns/status", "evalruns/status"]
  verbs: ["patch"]
# Children carry blockOwnerDeletion owner references; clusters that enforce owner-reference
# permissions (the OwnerReferencesPermissionEnforcement admission plugin) require this.
- apiGroups: ["gymkube.io"]
  resources: ["envpools/finalizers", "trainingruns/finalizers", "evalruns/finalizers"]
  verbs: ["update"]
# An EnvPool's env-server StatefulSet and router Deployment: server-side applied, and indexed and
# watched to compute the pool's status.
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["list", "watch", "create", "patch"]
# A deleted EnvPool's StatefulSet goes first, so its pods can be stopped without being replaced.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["delete"]
# The pool and backends Services, a TrainingRun's agent-loop ConfigMap, and an EvalRun's
# agent-loop and per-task results ConfigMaps: server-side applied.
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["create", "patch"]
# Whether a TrainingRun's customAgentLoop.configMap exists before its trainer is created.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
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
# recreates them); a TrainingRun or EvalRun lists its Job's pods to report why they failed.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# A running TrainingRun reads the tail of its trainer's log for the progress lines it prints; an
# EvalRun reads gymkube-eval's for its progress and its result with the per-task scores.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Preflight, training (one node) and eval Jobs, and RayJobs (several nodes): server-side applied,
# read back, watched for completion, and patched to suspend or resume them.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# A run queued in Kueue reads the Workload Kueue made for its Job or RayJob (why it waits, or was
# preempted; watched, so the run says so at once) and its position in the LocalQueue from Kueue's
# visibility API.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch"]
- apiGroups: ["visibility.kueue.x-k8s.io"]
  resources: ["localqueues/pendingworkloads"]
  verbs: ["get"]
# kopf and the operator report transitions as Events on the EnvPool, TrainingRun or EvalRun; the
# watchdog lists the Events of an env-server pod restarted and not up again (a startup-probe kill
# shows only there).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}
