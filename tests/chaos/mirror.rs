//! The fenced register cross-checked against S3 itself (issue 29, docs/safety.md
//! "Fault-injection harness", rule (f)).
//!
//! On S3 schedules every write to the harness's register on a mutex key is also a
//! `lockwarden::fenced` put, with the writer's fence, to an object of its own in a
//! bucket on the shared moto (a server the schedules' faults never touch: the point is
//! S3's verdict, not its availability). One async lock per key makes the register and
//! S3 see the key's writes in the same order, so their verdicts must agree: a write the
//! register accepts is acknowledged by S3, and a stale one the register refuses is
//! refused by S3 itself, in its conditional write.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use lockwarden::backend::FencedS3Object;
use lockwarden::fenced::{Fence, FencedError, FencedObject};

use crate::support::moto::{Moto, s3_client_for};

/// How long one put may take before its verdict counts as unknown (the shared moto is
/// not faulted, but the machine may be loaded).
const PUT_TIMEOUT: Duration = Duration::from_secs(10);

/// What S3 said, summed over a schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorCounts {
    /// Writes the register accepted and S3 acknowledged.
    pub acknowledged: usize,
    /// Stale writes the register refused and S3 refused too.
    pub refused: usize,
    /// Puts that did not answer (timeout, store error): no verdict to compare.
    pub unverified: usize,
}

/// Where the register's writes are mirrored: one fenced object per key.
pub struct S3Mirror {
    objects: HashMap<String, (tokio::sync::Mutex<()>, FencedS3Object)>,
    counts: Mutex<MirrorCounts>,
}

/// S3's verdict on one mirrored write, against the register's.
pub enum Verdict {
    Agree,
    /// A verdict that differs from the register's: the message says how.
    Disagree(String),
}

impl S3Mirror {
    /// A bucket of its own on the shared moto, an object per key.
    pub async fn new(keys: &[String]) -> S3Mirror {
        let moto = Moto::shared();
        let bucket = moto.new_bucket("chaos-fenced").await;
        let client = s3_client_for(&moto.endpoint()).await;
        let objects = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let object = FencedS3Object::new(client.clone(), &bucket, format!("register/{i}"));
                (key.clone(), (tokio::sync::Mutex::new(()), object))
            })
            .collect();
        S3Mirror {
            objects,
            counts: Mutex::default(),
        }
    }

    /// Runs `register` (the register's verdict on the write) and then the same write
    /// on S3, both within the key's turn, and compares them. `None` for a key that is
    /// not mirrored.
    pub async fn write(
        &self,
        key: &str,
        writer: &str,
        fence: u64,
        register: impl FnOnce() -> bool,
    ) -> (bool, Verdict) {
        let Some((turn, object)) = self.objects.get(key) else {
            return (register(), Verdict::Agree);
        };
        let _turn = turn.lock().await;
        let accepted = register();
        let data = format!("{writer} {fence}");
        let put = tokio::time::timeout(
            PUT_TIMEOUT,
            object.put(&Fence::new(fence, key), data.as_bytes()),
        )
        .await;
        let mut counts = self.counts.lock().unwrap();
        let verdict = match (accepted, put) {
            (true, Ok(Ok(_))) => {
                counts.acknowledged += 1;
                Verdict::Agree
            }
            (false, Ok(Err(FencedError::Stale { .. }))) => {
                counts.refused += 1;
                Verdict::Agree
            }
            (_, Err(_)) => {
                counts.unverified += 1;
                Verdict::Agree
            }
            (_, Ok(Err(e))) if !e.is_refusal() => {
                counts.unverified += 1;
                Verdict::Agree
            }
            (accepted, Ok(result)) => Verdict::Disagree(format!(
                "(f) the register {} fence {fence} of {writer} on {key}, but S3 {}",
                if accepted { "accepted" } else { "refused" },
                match result {
                    Ok(_) => "acknowledged it".to_string(),
                    Err(e) => format!("refused it: {e}"),
                }
            )),
        };
        (accepted, verdict)
    }

    /// Writes `fence` to `key`'s object without the register (a checker test).
    pub async fn write_object_only(&self, key: &str, fence: u64) {
        let (_, object) = &self.objects[key];
        object
            .put(&Fence::new(fence, key), b"behind the register's back")
            .await
            .expect("the write behind the register's back");
    }

    pub fn counts(&self) -> MirrorCounts {
        *self.counts.lock().unwrap()
    }
}
