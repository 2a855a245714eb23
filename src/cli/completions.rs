//! `lockwarden completions SHELL`: shell completion scripts (clap_complete).

use clap::Args;
use clap_complete::Shell;

use super::{CliError, exit};

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  lockwarden completions bash > ~/.local/share/bash-completion/completions/lockwarden
  lockwarden completions zsh > ~/.zfunc/_lockwarden
  lockwarden completions fish > ~/.config/fish/completions/lockwarden.fish")]
pub struct CompletionsArgs {
    /// The shell to generate completions for
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

/// Writes the completion script for `command` (the whole `lockwarden` CLI) to stdout.
pub fn run(args: CompletionsArgs, mut command: clap::Command) -> Result<u8, CliError> {
    let name = command.get_name().to_string();
    clap_complete::generate(args.shell, &mut command, name, &mut std::io::stdout());
    Ok(exit::OK)
}
