{{/* Chart name, overridable. */}}
{{- define "lockwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's resources. */}}
{{- define "lockwarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: stable across upgrades. */}}
{{- define "lockwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "lockwarden.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "lockwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* The ServiceAccount the controller runs as. */}}
{{- define "lockwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lockwarden.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of the leader-election Lease. */}}
{{- define "lockwarden.leaderLease" -}}
{{- default (printf "%s-leader" (include "lockwarden.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
Rules the controller needs on the namespaced resources it works with, in every
namespace it watches (cluster-wide: a ClusterRole; namespace-scoped: a Role).
Secrets are never here: they get Roles of their own, only where locks live.
*/}}
{{- define "lockwarden.controllerRules" -}}
# The DistributedLock objects: watch them, add/remove the release finalizer, and
# create per-Job locks from a template (Job gating).
- apiGroups: ["lockwarden.io"]
  resources: ["distributedlocks"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["lockwarden.io"]
  resources: ["distributedlocks/status"]
  verbs: ["get", "update", "patch"]
# An ownerReference with blockOwnerDeletion needs `update` on the owner's
# finalizers subresource where the OwnerReferencesPermissionEnforcement admission
# plugin runs (e.g. OpenShift); here for objects owned by a DistributedLock.
- apiGroups: ["lockwarden.io"]
  resources: ["distributedlocks/finalizers"]
  verbs: ["update"]
# Job gating: watch Jobs that name a lock, write the fence into the pod template
# and unsuspend them.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "update", "patch"]
# A Job suspended after losing its lock restarts with a new fence in its pod
# template, which before Kubernetes 1.36 the API server allows only once
# status.startTime is cleared (1.36's Job controller clears it itself).
- apiGroups: ["batch"]
  resources: ["jobs/status"]
  verbs: ["patch"]
# Per-Job locks are owned by their Job (blockOwnerDeletion, see above).
- apiGroups: ["batch"]
  resources: ["jobs/finalizers"]
  verbs: ["update"]
# Pod gating: watch Pods labelled lockwarden.io/gated=true (RBAC cannot limit a
# watch to a label; the controller asks for that selector), add the fence and remove
# the scheduling gate in one patch, delete a Pod whose lock is lost
# (lockwarden.io/on-lock-lost: delete), and look a claimant Pod up by name. Never
# create, update or exec.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# The Kubernetes Lease backend (and, in the release namespace, leader election).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Events on locks and Jobs (acquired, lost, forced, released, waiting for whom).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* Chart-level checks that would otherwise produce a broken install. */}}
{{- define "lockwarden.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: several active controllers would all try to hold every lock. Set leaderElection.enabled=true or replicaCount=1." (int .Values.replicaCount)) -}}
{{- end -}}
{{- if .Values.watchNamespace -}}
{{- range .Values.rbac.secretNamespaces -}}
{{- if ne . $.Values.watchNamespace -}}
{{- fail (printf "rbac.secretNamespaces lists %q, but watchNamespace is %q: in namespace-scoped mode locks (and so their credential Secrets) live only in watchNamespace; use rbac.secretsInWatchNamespace instead." . $.Values.watchNamespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) -}}
{{- fail "serviceMonitor.enabled requires service.enabled (the ServiceMonitor selects the metrics Service)" -}}
{{- end -}}
{{- end -}}
