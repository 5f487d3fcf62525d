/* fuse_ops.c: the compiled daemon's FUSE glue (libfuse3's low-level API). */

#ifndef PACKFS_CDAEMON_FUSE_OPS_H
#define PACKFS_CDAEMON_FUSE_OPS_H

#include "../cformat/forest.h"

/* libfuse's version (FUSE_VERSION of the library it runs with). */
int daemon_fuse_version(void);
/* Mount ``f`` at ``mountpoint`` with libfuse's ``-o options``; SIGINT, SIGTERM and
 * SIGHUP will end daemon_run.  0, or -1 with *why (libfuse printed more on stderr). */
int daemon_mount(Forest *f, const char *mountpoint, const char *options, int debug, const char **why);
/* Serve the mount until it is unmounted or a signal stops it, then unmount (the caller
 * then clears f->session): the session loop's status. */
int daemon_run(Forest *f, int threads, int clone_fd, int idle);
/* Unmount (only our own mount), give the signals back, free: a session mount() made. */
void end_session(Forest *f, struct fuse_session *session);

#endif
