//! `embed-dynamodb TABLE KEY`: holds `dynamodb://TABLE/KEY` for a moment and prints its
//! fence, with lockwarden's engine and its DynamoDB store alone (the endpoint, region
//! and credentials come from the AWS environment: `AWS_ENDPOINT_URL`, `AWS_REGION`, …).

use std::time::Duration;

use lockwarden_core::{AcquireRequest, LockError, Wait, acquire};
use lockwarden_stores::{ConnectOptions, DynamoDbOptions, Target};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(table), Some(key)) = (args.next(), args.next()) else {
        return Err("usage: embed-dynamodb TABLE KEY".into());
    };
    let target = Target::parse(&format!("dynamodb://{table}/{key}"))?;
    let options = ConnectOptions {
        dynamodb: DynamoDbOptions {
            create_table: true,
            ..DynamoDbOptions::default()
        },
        ..ConnectOptions::default()
    };
    let lock = target.connect(&options).await?;
    let request = AcquireRequest::new("embed-dynamodb", Duration::from_secs(30));
    let lease = acquire(lock.as_ref(), &request, Wait::For(Duration::from_secs(60))).await?;
    println!("holding {target} with fence {}", lease.fence().0);
    release(lock.as_ref(), &lease).await?;
    Ok(())
}

/// The work would go here, handed `lease.fence()`; this only lets go.
async fn release(
    lock: &dyn lockwarden_core::LockBackend,
    lease: &lockwarden_core::Lease,
) -> Result<(), LockError> {
    lock.release(lease).await
}
