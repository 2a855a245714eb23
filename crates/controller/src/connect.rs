//! The one way the controller gets a backend for a `DistributedLock`: its
//! [`LockAddress`] plus the credentials from its Secret, handed to the backend factory.
//! Nothing here knows which store the lock lives in.
//!
//! The reconciler asks a [`Connector`] for backends; [`FromSecrets`] is the one the
//! controller runs with. The seam lets the reconciler's unit tests hand it an
//! in-memory store instead of a real one.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::validated::LockAddress;
use lockwarden_core::LockBackend;
use lockwarden_stores::{ConnectError, Credentials};

/// Why a lock's backend could not be set up. Never carries the Secret's contents.
#[derive(Debug, thiserror::Error)]
pub enum ConnectFailure {
    #[error("credentials Secret {namespace}/{name}: {source}")]
    SecretUnreadable {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "credentials Secret {namespace}/{name} lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY"
    )]
    SecretIncomplete { namespace: String, name: String },
    #[error(transparent)]
    Backend(#[from] ConnectError),
}

/// Where the reconciler gets the backend of a lock in `lock_namespace`.
pub trait Connector: Send + Sync {
    fn backend<'a>(
        &'a self,
        client: &'a kube::Client,
        lock_namespace: &'a str,
        address: &'a LockAddress,
    ) -> BoxFuture<'a, Result<Arc<dyn LockBackend>, ConnectFailure>>;
}

/// The controller's connector: [`backend_for`].
pub struct FromSecrets;

impl Connector for FromSecrets {
    fn backend<'a>(
        &'a self,
        client: &'a kube::Client,
        lock_namespace: &'a str,
        address: &'a LockAddress,
    ) -> BoxFuture<'a, Result<Arc<dyn LockBackend>, ConnectFailure>> {
        backend_for(client, lock_namespace, address)
    }
}

/// Builds the backend of a lock in `lock_namespace`. Credentials are read only from a
/// Secret in that namespace (a lock cannot borrow another namespace's credentials).
///
/// Boxed: the AWS SDK's futures nest deeply, and without erasing the type here the
/// controller's whole future exceeds the compiler's default recursion limit wherever it
/// is checked for `Send` (in every crate that spawns `controller::run`).
pub fn backend_for<'a>(
    client: &'a kube::Client,
    lock_namespace: &'a str,
    address: &'a LockAddress,
) -> BoxFuture<'a, Result<Arc<dyn LockBackend>, ConnectFailure>> {
    async move {
        let mut options = address.connect_options.clone();
        options.kubernetes.client = Some(client.clone());
        if let Some(secret) = &address.credentials_secret {
            let credentials = read_credentials(client, lock_namespace, &secret.name).await?;
            options.aws.credentials = Some(credentials);
        }
        Ok(lockwarden_stores::connect(&address.target, &options).await?)
    }
    .boxed()
}

/// Static AWS credentials from a Secret (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// optional `AWS_SESSION_TOKEN`).
async fn read_credentials(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Credentials, ConnectFailure> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let secret = secrets
        .get(name)
        .await
        .map_err(|source| ConnectFailure::SecretUnreadable {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        })?;
    let data = secret.data.unwrap_or_default();
    let field = |k: &str| {
        data.get(k)
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    let (Some(id), Some(secret_key)) = (field("AWS_ACCESS_KEY_ID"), field("AWS_SECRET_ACCESS_KEY"))
    else {
        return Err(ConnectFailure::SecretIncomplete {
            namespace: namespace.to_string(),
            name: name.to_string(),
        });
    };
    Ok(Credentials::new(id, secret_key, field("AWS_SESSION_TOKEN")))
}
