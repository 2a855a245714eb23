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
# Once per run (lockwarden.io/once): a Job whose run another cluster already completed
# is deleted, not left suspended (a suspended Job stays in its CronJob's active list
# and blocks a Forbid CronJob's next run).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["delete"]
# A Job suspended after losing its lock restarts with a new fence in its pod
# template, which before Kubernetes 1.36 the API server allows only once
# status.startTime is cleared (1.36's Job controller clears it itself).
- apiGroups: ["batch"]
  resources: ["jobs/status"]
  verbs: ["patch"]
# A Job Kueue admits is never gated by lockwarden (two controllers writing its
# suspend would fight): it is Kueue's when a Kueue Workload names it. Read only;
# without Kueue's CRDs the list answers 404 and nothing is Kueue's.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list"]
# Per-Job locks are owned by their Job (blockOwnerDeletion, see above).
- apiGroups: ["batch"]
  resources: ["jobs/finalizers"]
  verbs: ["update"]
# Pod gating: watch Pods labelled lockwarden.io/gated=true (RBAC cannot limit a
# watch to a label; the controller asks for that selector), add the fence and remove
# the scheduling gate in one patch, delete a Pod whose lock is lost
# (lockwarden.io/on-lock-lost: delete), and look a claimant Pod up by name. Job
# gating: list a Job's Pods by its controller-uid label (no lock is released while one
# still runs) and delete them with their own grace period when the Job's lock is lost
# or the Job is deleted (docs/design.md §6.3). Where guard reports are trusted, watch
# the metadata of every Pod for a guard's request for a renewal
# (guard-waiting.lockwarden.io/*, §6.3). Never create, update or exec.
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
{{- if and .Values.kueue.admissionCheck .Values.watchNamespace -}}
{{- fail (printf "kueue.admissionCheck needs the cluster-wide mode, but watchNamespace is %q: Kueue's AdmissionChecks and ClusterQueues are cluster-scoped, which a namespace-scoped install cannot read. Leave watchNamespace empty." .Values.watchNamespace) -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) -}}
{{- fail "serviceMonitor.enabled requires service.enabled (the ServiceMonitor selects the metrics Service)" -}}
{{- end -}}
{{- end -}}

{{/*
Admission rules (templates/admission-rules.yaml): resourceRules for an API group's
resources, without operations (the policy and each binding add their own).
*/}}
{{- define "lockwarden.admissionResourceRules" -}}
- apiGroups: {{ toJson .groups }}
  apiVersions: ["v1"]
  resources: {{ toJson .resources }}
{{- end -}}

{{/*
Admission rules: whether the object (or template) at .path mentions lockwarden at all —
a lockwarden.io/ annotation, or for a Pod the label or the scheduling gate. A
matchCondition (which cannot read variables).
*/}}
{{- define "lockwarden.mentionsLockwarden" -}}
{{ .path }}.?metadata.?annotations.orValue({}).exists(k, k.startsWith('lockwarden.io/'))
{{- if .pod }} || {{ .path }}.?metadata.?labels.orValue({}).exists(k, k == 'lockwarden.io/gated') || (has({{ .path }}.spec.schedulingGates) && {{ .path }}.spec.schedulingGates.exists(g, g.name == 'lockwarden.io/lock'))
{{- end }}
{{- end -}}

{{/*
Admission rules: the lock annotations of the Pod or Job (.x: "pod" or "job") at .path,
as variables: <x>Annotations, <x>Single (which of lock / lock-template are set),
<x>Lists (which of locks / lock-templates are set), <x>Listed (every list entry,
trimmed, as decide.rs `locks` splits them), <x>NamesLock (any of the four is set: the
controller gates it).
*/}}
{{- define "lockwarden.lockAnnotationVariables" -}}
{{- $a := printf "variables.%sAnnotations" .x -}}
- name: {{ .x }}Annotations
  expression: "{{ .path }}.?metadata.?annotations.orValue({})"
- name: {{ .x }}Single
  expression: "['lockwarden.io/lock', 'lockwarden.io/lock-template'].filter(k, k in {{ $a }})"
- name: {{ .x }}Lists
  expression: "['lockwarden.io/locks', 'lockwarden.io/lock-templates'].filter(k, k in {{ $a }})"
- name: {{ .x }}Listed
  expression: "(('lockwarden.io/locks' in {{ $a }} ? {{ $a }}['lockwarden.io/locks'].split(',') : []) + ('lockwarden.io/lock-templates' in {{ $a }} ? {{ $a }}['lockwarden.io/lock-templates'].split(',') : [])).map(n, n.trim())"
- name: {{ .x }}NamesLock
  expression: "size(variables.{{ .x }}Single) + size(variables.{{ .x }}Lists) > 0"
{{- end -}}

{{/*
Admission rules: what decide.rs `locks` and machine.rs `Settings::of` refuse, for the
kind .kind whose on-lock-lost values are .onLockLost (jobs.rs JOB, pods.rs POD), when
.when holds. A DistributedLock name: lib `names::kubernetes_name` (DNS-1123 labels
joined by dots, at most 253 characters; no '/', so no other namespace).
*/}}
{{- define "lockwarden.lockAnnotationValidations" -}}
{{- $a := printf "variables.%sAnnotations" .x -}}
{{- $single := printf "variables.%sSingle" .x -}}
{{- $lists := printf "variables.%sLists" .x -}}
{{- $listed := printf "variables.%sListed" .x -}}
{{- $name := "n.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$') && size(n) <= 253" -}}
{{- $rule := "lowercase letters, digits, hyphens and dots, each dot-separated part starting and ending with a letter or digit, at most 253 characters, and no namespace" -}}
- expression: "!{{ .when }} || size({{ $single }}) < 2"
  message: '{{ .at }}both lockwarden.io/lock and lockwarden.io/lock-template are set; a {{ .kind }} names one lock with them (for several, list them in lockwarden.io/locks and lockwarden.io/lock-templates)'
  reason: Invalid
- expression: "!{{ .when }} || size({{ $single }}) == 0 || size({{ $lists }}) == 0"
  messageExpression: "'{{ .at }}' + 'both ' + {{ $single }}[0] + ' and ' + {{ $lists }}[0] + ' are set; name one lock with ' + {{ $single }}[0] + ', or list every lock in lockwarden.io/locks / lockwarden.io/lock-templates'"
  reason: Invalid
- expression: "!{{ .when }} || {{ $single }}.all(k, [{{ $a }}[k]].all(n, {{ $name }}))"
  messageExpression: "'{{ .at }}' + {{ $single }}.filter(k, ![{{ $a }}[k]].all(n, {{ $name }})).map(k, k + ': \"' + {{ $a }}[k] + '\" is not the name of a DistributedLock in the namespace of the {{ .kind }} ({{ $rule }})')[0]"
  reason: Invalid
- expression: "!{{ .when }} || {{ $listed }}.all(n, n != '')"
  message: '{{ .at }}a lock list (lockwarden.io/locks, lockwarden.io/lock-templates) has an empty entry; give DistributedLock names separated by commas, e.g. "db,bucket"'
  reason: Invalid
- expression: "!{{ .when }} || {{ $listed }}.all(n, n == '' || ({{ $name }}))"
  messageExpression: "'{{ .at }}' + {{ $listed }}.filter(n, n != '' && !({{ $name }})).map(n, 'lock list entry \"' + n + '\" is not the name of a DistributedLock in the namespace of the {{ .kind }} ({{ $rule }})')[0]"
  reason: Invalid
- expression: "!{{ .when }} || {{ $listed }}.all(n, n == '' || {{ $listed }}.filter(m, m == n).size() == 1)"
  messageExpression: "'{{ .at }}' + {{ $listed }}.filter(n, n != '' && {{ $listed }}.filter(m, m == n).size() > 1).map(n, 'lock list entry \"' + n + '\" is named twice')[0]"
  reason: Invalid
- expression: "!{{ .when }} || !variables.{{ .x }}NamesLock || !('lockwarden.io/on-lock-lost' in {{ $a }}) || {{ $a }}['lockwarden.io/on-lock-lost'] in {{ toJson .onLockLost | replace "\"" "'" }}"
  messageExpression: "'{{ .at }}' + 'lockwarden.io/on-lock-lost: \"' + {{ $a }}['lockwarden.io/on-lock-lost'] + '\" is not one of {{ join ", " .onLockLost }} (for a {{ .kind }})'"
  reason: Invalid
{{- end -}}

{{/*
Whether the API server serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
("true" or ""). Against a cluster helm discovers every served kind, so the answer is
exact (an API server that turned the API off says so). An offline render (`helm
template`) knows groups and versions only, not kinds — ValidatingAdmissionPolicy, served
on every supported version, is then missing too —, so there the version decides: GA and
on by default from 1.36.
*/}}
{{- define "lockwarden.mutatingPolicyServed" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}true{{ end -}}
{{- else if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}
true
{{- end -}}
{{- end -}}

{{/*
A value from values.yaml as a CEL ApplyConfiguration literal of type .type (e.g.
Object.spec.initContainers.securityContext): maps become typed objects, lists of maps
lists of the same type, strings single-quoted.
*/}}
{{- define "lockwarden.celLiteral" -}}
{{- $type := .type -}}
{{- if kindIs "map" .value -}}
{{ $type }}{
{{- $first := true -}}
{{- range $k, $v := .value -}}
{{- if not $first }}, {{ end -}}{{- $first = false -}}
{{ $k }}: {{ include "lockwarden.celLiteral" (dict "type" (printf "%s.%s" $type $k) "value" $v) }}
{{- end -}}
}
{{- else if kindIs "slice" .value -}}
[
{{- range $i, $v := .value -}}
{{- if $i }}, {{ end -}}
{{ include "lockwarden.celLiteral" (dict "type" $type "value" $v) }}
{{- end -}}
]
{{- else if kindIs "string" .value -}}
'{{ .value }}'
{{- else -}}
{{ .value }}
{{- end -}}
{{- end -}}

{{/*
Guard injection (templates/guard-injection.yaml): whether container c runs `lockwarden
guard` — its command and args together start with a file named lockwarden and the word
guard (controller/gating/decide.rs `runs_guard` says the same).
*/}}
{{- define "lockwarden.runsGuard" -}}
[c.?command.orValue([]) + c.?args.orValue([])].exists(argv, size(argv) >= 2 && (argv[0] == 'lockwarden' || argv[0].endsWith('/lockwarden')) && argv[1] == 'guard')
{{- end -}}

{{/*
Guard reports (templates/guard-report.yaml): whether the chart installs the policy that
confines `guard-ended.lockwarden.io/*` reports, and so tells the controller to trust
them ("true" or ""). Wherever the guard is injected (the report needs the Pod's name,
uid and container name the injection passes); never without the policy, since without
it any token that may patch Pods could forge one.
*/}}
{{- define "lockwarden.guardReports" -}}
{{- if and .Values.guard.reports.enabled .Values.guard.injection.enabled (not .Values.watchNamespace) (include "lockwarden.mutatingPolicyServed" .) -}}
true
{{- end -}}
{{- end -}}
