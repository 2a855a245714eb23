//! Whose store request this is: a holder's (renewing or releasing a lock it holds) or a
//! contender's (everything else). A store that makes requests wait for a bound lets a
//! holder's go first (docs/design.md §3, "Holders go first at the bound"): a late
//! renewal costs a held lock, a late acquisition only its wait.
//!
//! The priority is carried by the task, not by the [`RecordStore`](crate::RecordStore)
//! calls: the holder task sets it around its renewal and release, and every store call
//! made inside them — by [`CasLock`](crate::CasLock), a permit's protocol, a store's own
//! retries — inherits it without each layer passing it on.

use std::future::Future;

tokio::task_local! {
    static CURRENT: RequestPriority;
}

/// Which waiting store requests go first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPriority {
    /// Renewing or releasing a held lock: first.
    Holder,
    /// Acquiring, looking, waiting (the default): after every holder.
    Contender,
}

impl RequestPriority {
    /// The priority of the requests the current task makes: [`Contender`](Self::Contender)
    /// outside any [`scope`](Self::scope).
    pub fn current() -> RequestPriority {
        CURRENT
            .try_with(|priority| *priority)
            .unwrap_or(RequestPriority::Contender)
    }

    /// Runs `requests` with this priority.
    pub fn scope<F: Future>(self, requests: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_sets_the_priority_of_what_runs_inside_it_only() {
        assert_eq!(RequestPriority::current(), RequestPriority::Contender);
        let inside = RequestPriority::Holder
            .scope(async {
                tokio::task::yield_now().await;
                RequestPriority::current()
            })
            .await;
        assert_eq!(inside, RequestPriority::Holder);
        assert_eq!(RequestPriority::current(), RequestPriority::Contender);
    }
}
