//! `fsck.cairn`: see `cairn_fsck::cli`.

fn main() -> std::process::ExitCode {
    cairn_fsck::cli::main(std::env::args_os())
}
