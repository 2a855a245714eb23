//! `lockwarden put`, `get` and `delete`: fenced writes to the object a lock protects
//! ([`crate::fenced`]). A write carries the holder's fence and lock (by default
//! `LOCKWARDEN_FENCE` and `LOCKWARDEN_URL`, which `lockwarden run` gives its
//! command); a fence the lock never issued is refused first (rule 10, one read of the
//! lock), and the store itself refuses it, atomically, when a higher fence or another
//! lock wrote the object (exit 5).

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::{BackendArgs, CliError, exit, parse_target};
use lockwarden_core::fenced::{
    Content, Fence, FencedError, FencedObject, FencedRead, issued_fence,
};
use lockwarden_stores::{ConnectOptions, FencedTarget, Target, connect_fenced};

const TARGET_HELP: &str = "Fenced writes go to the object the lock protects, never to the lock \
itself. TARGET is s3://BUCKET/KEY (an object; its user metadata keeps the fence), \
dynamodb://TABLE/KEY (an item whose partition key value is KEY; --sort-key NAME=VALUE gives the \
sort key of a table that has one; the data is DynamoDB JSON such as \
{\"count\":{\"N\":\"3\"},\"state\":{\"S\":\"done\"}}, and only the attributes given are set) or \
k8s://NAMESPACE/RESOURCE/NAME (a Kubernetes object such as k8s://prod/configmaps/ledger; the data \
is the whole object as YAML or JSON; its lockwarden.io/fence annotation keeps the fence, checked by \
the API server with the chart's fencing admission policy; deletes are not fenced).

A write with a fence lower than the one that last wrote the object, or with another lock's fence, \
is refused by the store itself (exit 5). The lock is read once first: a fence above its latest (one \
it never issued), or a lock with no lockwarden record (free on ZooKeeper, deleted on release, \
another tool's), is refused before anything is written (exit 5). A delete leaves a fenced tombstone, so a stale holder \
cannot recreate the object. Fenced writes are for exclusive holders: a lock with several permits \
is refused.

Under `lockwarden run`, --fence and --lock default to the LOCKWARDEN_FENCE and LOCKWARDEN_URL \
the command gets:
  lockwarden run s3://locks/nightly -- sh -c 'make-report | lockwarden put s3://data/report.csv -'";

/// The fence a write carries: whose acquisition, of which lock.
#[derive(Args, Debug)]
pub struct FenceArgs {
    /// Your fence: the fencing token of your acquisition of the lock
    #[arg(long, value_name = "N", env = "LOCKWARDEN_FENCE", required = true)]
    pub fence: Option<u64>,

    /// The lock the fence belongs to (its URL, as for lock and run)
    #[arg(long, value_name = "URL", env = "LOCKWARDEN_URL", required = true, value_parser = parse_target)]
    pub lock: Option<Target>,
}

impl FenceArgs {
    /// The fence, once the lock is known to have one permit and to have issued it
    /// ([`lockwarden_core::fenced::issued_fence`]).
    async fn checked(&self, options: &ConnectOptions) -> Result<Fence, CliError> {
        let (Some(token), Some(lock)) = (self.fence, &self.lock) else {
            return Err(CliError::Usage(
                "--fence and --lock are required (or LOCKWARDEN_FENCE and LOCKWARDEN_URL)".into(),
            ));
        };
        let backend = lock.connect(options).await?;
        // What names the lock for every client of it (not how a client reaches it).
        issued_fence(backend.as_ref(), lock.order_key(), token)
            .await
            .map_err(|error| CliError::Fenced {
                target: lock.url(),
                error: Box::new(error),
            })
    }
}

#[derive(Args, Debug)]
#[command(after_help = TARGET_HELP)]
pub struct PutArgs {
    /// Where the data goes: s3://BUCKET/KEY, dynamodb://TABLE/KEY or k8s://NAMESPACE/RESOURCE/NAME
    #[arg(value_name = "TARGET", value_parser = FencedTarget::parse)]
    pub target: FencedTarget,

    /// The data: a file, or - for standard input
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    #[command(flatten)]
    pub fence: FenceArgs,

    #[command(flatten)]
    pub backend: BackendArgs,
}

#[derive(Args, Debug)]
#[command(after_help = TARGET_HELP)]
pub struct DeleteArgs {
    /// The object to delete: s3://BUCKET/KEY or dynamodb://TABLE/KEY (Kubernetes objects: not fenced)
    #[arg(value_name = "TARGET", value_parser = FencedTarget::parse)]
    pub target: FencedTarget,

    #[command(flatten)]
    pub fence: FenceArgs,

    #[command(flatten)]
    pub backend: BackendArgs,
}

#[derive(Args, Debug)]
#[command(after_help = TARGET_HELP)]
pub struct GetArgs {
    /// The object to read: s3://BUCKET/KEY, dynamodb://TABLE/KEY or k8s://NAMESPACE/RESOURCE/NAME
    #[arg(value_name = "TARGET", value_parser = FencedTarget::parse)]
    pub target: FencedTarget,

    /// Output format [default: the data on stdout, the fence that wrote it on stderr]
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,

    #[command(flatten)]
    pub backend: BackendArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One document: url, state, fence, lock and data (as text)
    Json,
}

/// What `get -o json` prints.
#[derive(Debug, Serialize)]
struct Document {
    url: String,
    /// `written`, `deleted` (a fenced tombstone) or `absent`.
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lock: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<String>,
}

fn fenced_error(target: &FencedTarget, error: FencedError) -> CliError {
    CliError::Fenced {
        target: target.url(),
        error: Box::new(error),
    }
}

async fn object(
    target: &FencedTarget,
    options: &ConnectOptions,
) -> Result<Box<dyn FencedObject>, CliError> {
    connect_fenced(target, options)
        .await
        .map_err(|e| fenced_error(target, e))
}

fn read_data(file: &PathBuf) -> Result<Vec<u8>, CliError> {
    let mut data = Vec::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut data).map(|_| ())
    } else {
        std::fs::read(file).map(|d| data = d)
    };
    read.map_err(|source| CliError::Io {
        context: if file.as_os_str() == "-" {
            "reading standard input".into()
        } else {
            format!("reading {}", file.display())
        },
        source,
    })?;
    Ok(data)
}

pub async fn put(args: PutArgs) -> Result<u8, CliError> {
    let data = read_data(&args.file)?;
    let options = args.backend.options(None);
    let object = object(&args.target, &options).await?;
    object
        .check_data(&data)
        .map_err(|e| fenced_error(&args.target, e))?;
    let fence = args.fence.checked(&options).await?;
    object
        .put(&fence, &data)
        .await
        .map_err(|e| fenced_error(&args.target, e))?;
    tracing::info!(target = %args.target, fence = %fence.token, "written");
    Ok(exit::OK)
}

pub async fn delete(args: DeleteArgs) -> Result<u8, CliError> {
    let options = args.backend.options(None);
    let object = object(&args.target, &options).await?;
    let fence = args.fence.checked(&options).await?;
    object
        .delete(&fence)
        .await
        .map_err(|e| fenced_error(&args.target, e))?;
    tracing::info!(target = %args.target, fence = %fence.token, "deleted (tombstone)");
    Ok(exit::OK)
}

pub async fn get(args: GetArgs) -> Result<u8, CliError> {
    let options = args.backend.options(None);
    let object = object(&args.target, &options).await?;
    let read = object
        .get()
        .await
        .map_err(|e| fenced_error(&args.target, e))?;
    let url = args.target.url();
    if args.output == Some(Format::Json) {
        let doc = document(url, read);
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("document serialises")
        );
        return Ok(exit::OK);
    }
    let Some(FencedRead {
        written_by,
        content,
    }) = read
    else {
        return Err(CliError::Reported {
            code: exit::ERROR,
            message: format!("{url}: no such object"),
        });
    };
    let by = match &written_by {
        Some(fence) => format!("fence {} of lock {}", fence.token, fence.lock),
        None => "no fence (not written by a fenced write yet)".into(),
    };
    match content {
        Content::Deleted => Err(CliError::Reported {
            code: exit::ERROR,
            message: format!("{url}: deleted by {by} (a fenced tombstone)"),
        }),
        Content::Data(data) => {
            std::io::stdout()
                .write_all(&data)
                .and_then(|()| std::io::stdout().flush())
                .map_err(|source| CliError::Io {
                    context: "writing standard output".into(),
                    source,
                })?;
            eprintln!("lockwarden: {url}: written by {by}");
            Ok(exit::OK)
        }
    }
}

fn document(url: String, read: Option<FencedRead>) -> Document {
    let Some(read) = read else {
        return Document {
            url,
            state: "absent",
            fence: None,
            lock: None,
            data: None,
        };
    };
    let (state, data) = match read.content {
        Content::Deleted => ("deleted", None),
        Content::Data(d) => ("written", Some(String::from_utf8_lossy(&d).into_owned())),
    };
    Document {
        url,
        state,
        fence: read.written_by.as_ref().map(|f| f.token.0),
        lock: read.written_by.map(|f| f.lock),
        data,
    }
}
