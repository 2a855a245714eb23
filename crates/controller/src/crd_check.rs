//! Whether the installed `DistributedLock` CRD is the one this controller was built
//! with. Helm installs a chart's CRDs on the first install only and never upgrades
//! them, so after `helm upgrade` the cluster may still serve an older schema: fields
//! this build writes may then be pruned, and validation may differ. The controller
//! says so at start-up, with the command that fixes it; it runs on either way (the
//! formats are kept compatible between consecutive releases).

use std::fmt::Display;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

use lockwarden_api::{CRD_NAME, CRD_REVISION, installed_crd_revision};

/// How to install the CRD of this release (README "Install").
const APPLY_CRD: &str = "kubectl apply --server-side --force-conflicts -f charts/lockwarden/crds/";

/// What to say about an installed CRD of `installed` revision (or why it is unreadable),
/// for a controller built with revision `expected`; `None` when they agree.
pub fn verdict<E: Display>(installed: Result<u32, E>, expected: u32) -> Option<String> {
    match installed {
        Ok(revision) if revision == expected => None,
        Ok(revision) if revision < expected => Some(format!(
            "the installed {CRD_NAME} CRD is revision {revision}, older than this controller's \
             {expected}: Helm does not upgrade CRDs; apply this release's CRD ({APPLY_CRD})"
        )),
        Ok(revision) => Some(format!(
            "the installed {CRD_NAME} CRD is revision {revision}, newer than this controller's \
             {expected} (a newer release's CRD under an older controller): upgrade the controller, \
             or apply this release's CRD ({APPLY_CRD})"
        )),
        Err(why) => Some(format!(
            "the installed {CRD_NAME} CRD has an unreadable revision ({why}); apply this release's CRD ({APPLY_CRD})"
        )),
    }
}

/// Reads the installed CRD and warns when its revision is not this build's. A
/// controller that may not read CRDs (a namespace-scoped install) says so at debug
/// level and goes on.
pub async fn warn_if_outdated(client: &kube::Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    match crds.get(CRD_NAME).await {
        Ok(crd) => {
            if let Some(warning) = verdict(installed_crd_revision(&crd), CRD_REVISION) {
                tracing::warn!(crd = CRD_NAME, "{warning}");
            } else {
                tracing::debug!(
                    crd = CRD_NAME,
                    revision = CRD_REVISION,
                    "installed CRD is this build's"
                );
            }
        }
        Err(error) => {
            tracing::debug!(crd = CRD_NAME, %error, "cannot read the installed CRD to compare its revision");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::verdict`] with the reason a revision is unreadable given as text.
    fn verdict(installed: Result<u32, &str>, expected: u32) -> Option<String> {
        super::verdict(installed, expected)
    }

    #[test]
    fn an_older_or_newer_crd_is_named_with_the_fix() {
        assert_eq!(verdict(Ok(2), 2), None);
        let older = verdict(Ok(1), 2).expect("a warning");
        assert!(
            older.contains("revision 1, older than this controller's 2"),
            "{older}"
        );
        assert!(older.contains(APPLY_CRD), "{older}");
        let newer = verdict(Ok(3), 2).expect("a warning");
        assert!(newer.contains("newer than this controller's 2"), "{newer}");
        let unreadable = verdict(Err("x"), 2).expect("a warning");
        assert!(
            unreadable.contains("unreadable revision (x)"),
            "{unreadable}"
        );
    }

    #[test]
    fn a_crd_without_the_annotation_is_revision_1_and_the_generated_one_is_current() {
        let mut crd = lockwarden_api::crd();
        assert_eq!(installed_crd_revision(&crd), Ok(CRD_REVISION));
        crd.metadata.annotations = None;
        assert_eq!(installed_crd_revision(&crd), Ok(1));
    }
}
