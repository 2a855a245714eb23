//! [`BackendKind`]: which kind of store a lock lives in. A module of its own so that
//! errors can name kinds without depending on the spec types.

/// Which kind of store a lock lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    S3,
    DynamoDb,
    ZooKeeper,
    Kubernetes,
}

impl BackendKind {
    /// The field name in `spec.backend` and the `Backend` printer column value:
    /// `s3`, `dynamodb`, `zookeeper`, `kubernetes`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::S3 => "s3",
            BackendKind::DynamoDb => "dynamodb",
            BackendKind::ZooKeeper => "zookeeper",
            BackendKind::Kubernetes => "kubernetes",
        }
    }

    /// The URL scheme of lock keys of this kind (`s3`, `dynamodb`, `zk`, `k8s`).
    pub fn scheme(self) -> &'static str {
        match self {
            BackendKind::S3 => "s3",
            BackendKind::DynamoDb => "dynamodb",
            BackendKind::ZooKeeper => "zk",
            BackendKind::Kubernetes => "k8s",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
