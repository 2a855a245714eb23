//! `lockwarden check-fence URL FENCE`: whether FENCE is still a current holder's on
//! the lock (Chubby's `CheckSequencer`), for a service about to do work on a caller's
//! behalf. Advisory: the holder may lose the lock right after the answer; only a
//! conditional write at the resource is safe (see [`lockwarden_core::sequencer`]).

use clap::Args;

use super::{BackendArgs, CliError, exit, parse_fence, print_error};
use lockwarden_core::{FenceCheck, FenceToken};
use lockwarden_stores::Target;

#[derive(Args, Debug)]
pub struct CheckFenceArgs {
    /// The lock: s3://BUCKET/KEY, dynamodb://TABLE/KEY, zk://HOST:PORT[,HOST:PORT...]/PATH or k8s://NAMESPACE/LEASE-NAME
    #[arg(value_name = "URL", value_parser = super::parse_target)]
    pub url: Target,

    /// The fence to check: the caller's sequencer (what its LOCKWARDEN_FENCE or
    /// lockwarden.io/fence says), a plain decimal number
    #[arg(value_name = "FENCE", value_parser = parse_fence)]
    pub fence: FenceToken,

    #[command(flatten)]
    pub backend: BackendArgs,
}

pub async fn run(args: CheckFenceArgs) -> Result<u8, CliError> {
    let backend = args.url.connect(&args.backend.options(None)).await?;
    // A store that is still starting is retried for the connect timeout, as `status` does.
    let check = lockwarden_core::when_reachable(|| {
        lockwarden_core::check_fence(backend.as_ref(), args.fence)
    })
    .await?;
    let line = format!("{}: {check}", backend.url());
    match check {
        FenceCheck::Current { .. } => {
            println!("{line}");
            Ok(exit::OK)
        }
        FenceCheck::NotCurrent { .. } => {
            print_error(&line);
            Ok(exit::STALE_FENCE)
        }
    }
}
