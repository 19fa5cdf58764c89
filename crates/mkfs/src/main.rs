//! `mkfs.cairn`: see `cairn_mkfs::cli`.

fn main() -> std::process::ExitCode {
    cairn_mkfs::cli::main(std::env::args_os())
}
