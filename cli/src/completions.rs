//! `kvtier completions <shell>`: a shell completion script on standard output.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::common::Failure;
use crate::Cli;

#[derive(Args, Debug, Clone)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn run(args: &CompletionsArgs) -> Result<(), Failure> {
    let mut command = Cli::command();
    let name = command.get_name().to_string();
    clap_complete::generate(args.shell, &mut command, name, &mut std::io::stdout());
    Ok(())
}
