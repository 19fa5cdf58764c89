//! `cairn-db`: see `cairn_fsck::db`.

fn main() -> std::process::ExitCode {
    cairn_fsck::db::main(std::env::args_os())
}
