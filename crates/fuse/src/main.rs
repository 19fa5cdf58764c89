//! `cairn`: see `cairn_fuse::cli`.

fn main() -> std::process::ExitCode {
    cairn_fuse::cli::main(std::env::args_os())
}
