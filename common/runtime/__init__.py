"""The MPI runtime both programs stand on: roles and communicators, start-up protocol, handshake,
bounded waits, message tags and headers, traces, metrics logs, the
allocator settings and the launcher->program environment variables."""
