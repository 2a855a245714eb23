//! One lock key on each store, for tests that run the same scenario on every store:
//! `Key::handle()` is a new contender with its own state (and, on ZooKeeper, its own
//! session).

use std::sync::Arc;

use lockwarden::backend::dynamodb::DynamoDbKey;
use lockwarden::backend::s3::S3Key;
use lockwarden::backend::{LeaseStore, ZkSessions};
use lockwarden::lock::{CasLock, LockBackend, RecordStore};

use super::kube::{ControlPlane, client_from_kubeconfig};
use super::moto::{aws_options_for, new_bucket_at, new_table_at};
use super::stores::{AwsServer, Choice, dynamodb_shared, s3_shared};
use super::zookeeper::ZooKeeper;

/// One lock key on one store; every `handle()` is a new contender (own observer state).
#[derive(Clone)]
pub enum Key {
    S3 {
        endpoint: String,
        bucket: String,
        key: String,
    },
    Dynamo {
        endpoint: String,
        table: String,
        key: String,
    },
    Lease {
        kubeconfig: std::path::PathBuf,
        namespace: String,
        name: String,
    },
    /// A lock path on the shared single ZooKeeper; every handle has its own session.
    ZooKeeper { connect: String, path: String },
}

impl Key {
    pub async fn s3() -> Key {
        Key::s3_on(s3_shared()).await
    }

    pub async fn s3_on(server: &dyn AwsServer) -> Key {
        let endpoint = server.endpoint();
        Key::S3 {
            bucket: new_bucket_at(&endpoint, "engine").await,
            endpoint,
            key: super::unique("locks/k"),
        }
    }

    pub async fn dynamo() -> Key {
        Key::dynamo_on(dynamodb_shared()).await
    }

    pub async fn dynamo_on(server: &dyn AwsServer) -> Key {
        let endpoint = server.endpoint();
        Key::Dynamo {
            table: new_table_at(&endpoint, "engine", "key").await,
            endpoint,
            key: super::unique("k"),
        }
    }

    /// The key on a server of its own where the shared one answers one request at a
    /// time (moto-atomic), so that a test loading it neither slows the other tests
    /// down nor waits for them; the server lives as long as the returned one.
    pub async fn on_own_server_if_serialized(
        server: Choice,
        on: impl AsyncFn(&dyn AwsServer) -> Key,
    ) -> (Option<Box<dyn AwsServer>>, Key) {
        if server.serializes_requests() {
            let own = server.start();
            let key = on(own.as_ref()).await;
            (Some(own), key)
        } else {
            (None, on(server.shared()).await)
        }
    }

    /// The port of the server behind this key (to put a fault proxy in front of it).
    pub fn server_port(&self) -> u16 {
        let (Key::S3 { endpoint, .. } | Key::Dynamo { endpoint, .. }) = self else {
            panic!("only S3 and DynamoDB keys have an AWS server")
        };
        endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {endpoint}"))
    }

    pub async fn lease() -> Key {
        let cp = ControlPlane::shared();
        let client = cp.client().await;
        let namespace = cp.namespace(&client, "engine").await;
        Key::Lease {
            kubeconfig: cp.kubeconfig_path().to_path_buf(),
            namespace,
            name: super::unique("lock"),
        }
    }

    pub fn zookeeper() -> Key {
        Key::ZooKeeper {
            connect: ZooKeeper::shared().connect_string(),
            path: format!("/lockwarden-test/{}", super::unique("lock")),
        }
    }

    /// The same key reached through `endpoint` (e.g. a fault proxy).
    pub fn via(&self, endpoint: String) -> Key {
        match self.clone() {
            Key::S3 { bucket, key, .. } => Key::S3 {
                endpoint,
                bucket,
                key,
            },
            Key::Dynamo { table, key, .. } => Key::Dynamo {
                endpoint,
                table,
                key,
            },
            other => other,
        }
    }

    pub async fn handle(&self) -> Arc<dyn LockBackend> {
        /// A lock on a store of records.
        fn cas(store: impl RecordStore + 'static) -> Arc<dyn LockBackend> {
            Arc::new(CasLock::new(store))
        }
        match self {
            // The product's S3 lock (`backend::s3::connect`): its client, its signed
            // PUTs.
            Key::S3 {
                endpoint,
                bucket,
                key,
            } => lockwarden::backend::s3::connect(
                &S3Key {
                    bucket: bucket.clone(),
                    key: key.clone(),
                },
                &aws_options_for(endpoint),
                &Default::default(),
            )
            .await
            .expect("an S3 lock connects"),
            // The product's DynamoDB lock, as S3's above.
            Key::Dynamo {
                endpoint,
                table,
                key,
            } => lockwarden::backend::dynamodb::connect(
                &DynamoDbKey {
                    table: table.clone(),
                    key: key.clone(),
                },
                &aws_options_for(endpoint),
                &Default::default(),
            )
            .await
            .expect("a DynamoDB lock connects"),
            Key::Lease {
                kubeconfig,
                namespace,
                name,
            } => cas(LeaseStore::new(
                client_from_kubeconfig(kubeconfig).await,
                namespace,
                name,
            )),
            Key::ZooKeeper { connect, path } => Arc::new(
                ZkSessions::new()
                    .lock(connect, path)
                    .expect("a valid lock path"),
            ),
        }
    }
}
