//! The C library's allocator, set up once at the start of the process.
//!
//! glibc's `malloc` keeps freed small blocks in "fastbins" that it merges back only
//! when a larger request comes (`malloc_consolidate`). A renewal frees a few dozen small
//! blocks (the request, its headers, the reply) and then asks for a buffer of several
//! KB for the next reply, so a process that renews many locks merged the same blocks
//! again on every request: about a fifth of a renewal's CPU was glibc's allocator
//! (docs/benchmarks.md, "Renewal CPU: glibc without fastbins"). Without fastbins, a
//! freed small block goes to the thread's cache (tcache) as before, and past that to
//! the bins where it is merged when freed, which costs less than merging it later in
//! bulk. Neither a command's time nor its memory changed (the same section).

/// Turns glibc's fastbins off (`mallopt(M_MXFAST, 0)`), before the process allocates
/// much. Nothing to do with another C library.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt(3) changes the allocator's settings under its own lock; it
        // touches no memory of ours. Its result (1 on success) needs no check: if it
        // failed, the process runs with glibc's defaults, as before.
        unsafe {
            libc::mallopt(libc::M_MXFAST, 0);
        }
    }
}
