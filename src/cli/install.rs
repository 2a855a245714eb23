//! `lockwarden install DIR`: copies this binary into DIR, an init container's step
//! before `guard` (docs/design.md §3 rule 9): the published image is distroless, with
//! no shell or `cp` to do it.

use std::path::PathBuf;

use clap::Args;

use super::{CliError, exit};

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// The directory to copy the binary into (an emptyDir the workload container mounts);
    /// the copy is DIR/lockwarden, executable by everyone
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

pub fn run(args: InstallArgs) -> Result<u8, CliError> {
    let io = |context: String| move |source| CliError::Io { context, source };
    let me = std::env::current_exe().map_err(io("cannot find this binary".into()))?;
    let target = args.dir.join("lockwarden");
    // Written beside the target and renamed over it: a reader never sees half a binary.
    let partial = args.dir.join(".lockwarden.partial");
    std::fs::copy(&me, &partial).map_err(io(format!(
        "cannot copy {} into {}",
        me.display(),
        args.dir.display()
    )))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .and_then(|()| std::fs::rename(&partial, &target))
        .map_err(io(format!("cannot install {}", target.display())))?;
    println!("installed {}", target.display());
    Ok(exit::OK)
}
