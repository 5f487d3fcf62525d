/* The FUSE glue of the compiled daemon (packfs._lowlevel): libfuse3's low-level
 * callbacks, each running an operation of the format library (packfs/cformat/) on the
 * Forest the session serves, then the change check (finished), and the session's
 * mount, loop and end.
 *
 *   inode   = entry index + 1 (the root is 1), shifted by its shard's base in a set;
 *             no per-inode state: FORGET costs nothing.
 *   READDIRPLUS hands the kernel the children's attributes with a listing ("auto").
 *   OPEN and OPENDIR answer ENOSYS: the kernel then stops sending them, keeps file
 *             pages across opens and caches listings (no_open, no_opendir).
 *   READ    = the record read and checked by records.c; a READ of a record another
 *             thread is checking is parked (it holds no worker thread) and answered
 *             by that thread (answer_parked_read).
 *
 * This file reads no byte of the archive itself.
 */

/* 3.12's loop configuration sets a thread limit; 3.10 and 3.11 serve without one. */
#ifdef PACKFS_FUSE_312
#define FUSE_USE_VERSION 312
#else
#define FUSE_USE_VERSION 35
#endif
#include <fuse_lowlevel.h>

#include "fuse_ops.h"

#include "../cformat/forest.h"
#include "../cformat/lookup.h"
#include "../cformat/records.h"
#include "../cformat/table.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

/* The archive never changes while mounted (a change is EIO), so the kernel may keep
 * entries, attributes and negative lookups for long: packfs.fuse.common.CACHE_SECONDS. */
#define CACHE_SECONDS 86400.0

/* -- the FUSE callbacks: each runs an operation, then the change check -------------------- */

static Forest *forest_of(fuse_req_t request)
{
    return (Forest *) fuse_req_userdata(request);
}


static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
    if (conn->capable & FUSE_CAP_READDIRPLUS)
        conn->want |= FUSE_CAP_READDIRPLUS;
    /* "auto": the kernel asks for attributes with a listing (READDIRPLUS) for its first
     * part, and after that only while the program stats what it lists (ls -l); a walk
     * that only reads names and types (find, os.walk) gets plain READDIRs, for which the
     * kernel builds no inode per entry (10,000,000 entries: find took 68-88 s with
     * READDIRPLUS always, against 12 s through the Python daemon). */
    if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO)
        conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
        conn->want |= FUSE_CAP_CACHE_SYMLINKS;
    /* An archive with attributes: the kernel then keeps each inode's POSIX ACLs (which
     * ls -l asks for, two per file, and which it would otherwise fetch on every call) and
     * enforces them, as it does a disk's; packfs mounts with default_permissions, which
     * this implies, anyway. */
    Forest *f = userdata;
    if (f->xattrs && (conn->capable & FUSE_CAP_POSIX_ACL))
        conn->want |= FUSE_CAP_POSIX_ACL;
    /* The archive never changes: nothing to invalidate when attributes are fetched. */
    conn->want &= ~(unsigned) FUSE_CAP_AUTO_INVAL_DATA;
    /* max_pages follows max_write in libfuse: 1 MiB requests, READ included. */
    conn->max_write = MAX_REQUEST;
    conn->max_read = MAX_REQUEST;  /* as -o max_read= says (libfuse insists they agree) */
    conn->time_gran = 1;
}

static void ll_lookup(fuse_req_t request, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param entry;
    memset(&entry, 0, sizeof entry);
    int error = forest_lookup(forest_of(request), parent, (const uint8_t *) name, strlen(name), &entry.attr);
    entry.attr_timeout = entry.entry_timeout = CACHE_SECONDS;
    if (error == ENOENT) {
        fuse_reply_entry(request, &entry);  /* inode 0: a negative entry the kernel keeps */
    } else if (error) {
        fuse_reply_err(request, error);
    } else {
        entry.ino = entry.attr.st_ino;
        fuse_reply_entry(request, &entry);
    }
}

static void ll_getattr(fuse_req_t request, fuse_ino_t inode, struct fuse_file_info *info)
{
    struct stat st;
    int error = forest_getattr(forest_of(request), inode, &st);
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_attr(request, &st, CACHE_SECONDS);
}

static void ll_readlink(fuse_req_t request, fuse_ino_t inode)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    char target[MAX_SYMLINK_TARGET + 1];
    int error = resolve(forest_of(request), inode, &t, &shard, &local);
    if (!error)
        error = finished(t, tree_readlink(t, local, target));
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_readlink(request, target);
}

static void ll_open(fuse_req_t request, fuse_ino_t inode, struct fuse_file_info *info)
{
    if (forest_of(request)->trees[0]->direct_io) {  /* -o direct_io: every read comes here, none from the page cache */
        info->direct_io = 1;
        fuse_reply_open(request, info);
        return;
    }
    /* The kernel then opens every file itself (no_open) and keeps its pages cached. */
    fuse_reply_err(request, ENOSYS);
}

static void ll_opendir(fuse_req_t request, fuse_ino_t inode, struct fuse_file_info *info)
{
    /* no_opendir: the kernel also caches listings (Linux 5.1, "fuse: cache readdir
     * calls if filesystem opts out of opendir"). */
    fuse_reply_err(request, ENOSYS);
}

/* READ, from a worker thread or from the thread whose check a READ was parked on
 * (``inode`` is the tree's own). */
static void answer_read(Tree *t, fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset);

/* A READ parked on another thread's check of its record, answered by that thread when
 * the check ended: served as any READ of a checked (or failed) record is, or ``error``. */
static void answer_parked_read(Tree *t, const Parked *parked, int error)
{
    if (error)
        fuse_reply_err(parked->request, error);
    else
        answer_read(t, parked->request, parked->inode, parked->size, (off_t) parked->offset);
}

static void answer_read(Tree *t, fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset)
{
    /* A parked READ is answered inside the checking thread's own operation: its pages
     * are its own (finished resets them), the operation's are given back after. */
    int outer_failure = page_failure;
    page_failure = 0;
    Parked park = {request, inode, size, (uint64_t) offset, answer_parked_read, NULL};
    uint8_t *data = NULL;
    size_t got, skip;
    int error = offset < 0 ? EINVAL : read_or_park(t, inode, (uint64_t) offset, size, &data, &got, &skip, &park);
    if (error == PARKED) {
        page_failure = outer_failure;
        return;
    }
    if ((error = finished(t, error)) != 0) {
        free(data);  /* read, then found changed: the bytes are not answered, nor kept */
        fuse_reply_err(request, error);
    } else {
        /* No bytes (at or past the end, or size 0) come with no buffer: NULL + 0 is undefined. */
        fuse_reply_buf(request, data != NULL ? (const char *) data + skip : NULL, got);
        free(data);
    }
    page_failure = outer_failure;
}

static void ll_read(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset, struct fuse_file_info *info)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(forest_of(request), inode, &t, &shard, &local);
    if (error)
        fuse_reply_err(request, error);
    else
        answer_read(t, request, local, size, offset);
}

#define FIRST_LISTING_WITH_ATTRIBUTES 3  /* ".", ".." and one entry: see reply_listing */

typedef struct {
    fuse_req_t request;
    char *buffer;
    size_t size, used;
    int plus;
} ListingReply;

static int add_to_reply(void *context, const char *name, const struct stat *st, int attributes, uint64_t next)
{
    ListingReply *reply = context;
    size_t room = reply->size - reply->used, added;
    if (reply->plus) {
        /* Without attributes (".", "..", a child whose attributes break a rule) an entry
         * goes with inode 0: the kernel then makes no entry of it. */
        struct fuse_entry_param entry;
        memset(&entry, 0, sizeof entry);
        entry.attr = *st;
        if (attributes) {
            entry.ino = st->st_ino;
            entry.attr_timeout = entry.entry_timeout = CACHE_SECONDS;
        }
        added = fuse_add_direntry_plus(reply->request, reply->buffer + reply->used, room, name, &entry, (off_t) next);
    } else {
        added = fuse_add_direntry(reply->request, reply->buffer + reply->used, room, name, st, (off_t) next);
    }
    if (added > room)
        return 1;  /* full: the kernel asks again from this position */
    reply->used += added;
    return 0;
}

static void reply_listing(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset, int plus)
{
    if (offset < 0) {
        fuse_reply_err(request, EINVAL);
        return;
    }
    ListingReply reply = {request, malloc(size ? size : 1), size, 0, plus};
    if (reply.buffer == NULL) {
        fuse_reply_err(request, ENOMEM);
        return;
    }
    /* The kernel's "auto" mode asks for attributes with the first part of every listing
     * (offset 0), whether or not the program will stat what it lists; given a full
     * buffer of them, a walk (os.walk, find) made the kernel build an inode per entry:
     * a cold walk of 100,000 files took 0.21 s, against 0.09 s without attributes.  So
     * the first READDIRPLUS of a directory answers ".", ".." and one entry only: the next
     * part is asked for with a plain READDIR, unless the program stat'ed that entry (ls
     * -l: its LOOKUP tells the kernel to ask for attributes again), and ls -l costs the
     * same as before (bench/cold_walk.py). */
    uint64_t limit = plus && offset == 0 ? FIRST_LISTING_WITH_ATTRIBUTES : UINT64_MAX;
    int error = forest_listing(forest_of(request), inode, (uint64_t) offset, plus, limit, add_to_reply, &reply);
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_buf(request, reply.buffer, reply.used);
    free(reply.buffer);
}

static void ll_readdir(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset, struct fuse_file_info *info)
{
    reply_listing(request, inode, size, offset, 0);
}

static void ll_readdirplus(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset,
                           struct fuse_file_info *info)
{
    reply_listing(request, inode, size, offset, 1);
}

static void ll_statfs(fuse_req_t request, fuse_ino_t inode)
{
    struct statvfs st;
    int error = forest_statfs(forest_of(request), &st);
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_statfs(request, &st);
}

/* GETXATTR.  A set without attributes answers ENOSYS: the kernel then stops sending
 * GETXATTR for this mount (ls asks for security.selinux of each file it lists), and
 * getxattr(2) says EOPNOTSUPP. */
static void ll_getxattr(fuse_req_t request, fuse_ino_t inode, const char *name, size_t size)
{
    Forest *f = forest_of(request);
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    if (!f->xattrs) {
        int error = resolve(f, inode, &t, &shard, &local);
        fuse_reply_err(request, error ? error : finished(t, ENOSYS));
        return;
    }
    int error = resolve(f, inode, &t, &shard, &local);
    if (error) {
        fuse_reply_err(request, error);
        return;
    }
    XattrQuery q;
    memset(&q, 0, sizeof q);
    q.wanted = (const uint8_t *) name;
    q.wanted_length = strlen(name);
    error = tree_xattrs(t, local, &q);
    if (!error && !q.found)
        error = ENODATA;
    if (!error && size && size < q.value_length)
        error = ERANGE;
    /* The value is read off the map: the change check comes after the copy. */
    if (!error && size == 0) {
        error = finished(t, 0);
        if (!error) {
            fuse_reply_xattr(request, q.value_length);
            return;
        }
    }
    if (!error) {
        uint8_t *copy = malloc(q.value_length ? q.value_length : 1);
        if (copy == NULL) {
            fuse_reply_err(request, finished(t, ENOMEM));
            return;
        }
        memcpy(copy, q.value, q.value_length);
        error = finished(t, 0);
        if (!error)
            fuse_reply_buf(request, (const char *) copy, q.value_length);
        free(copy);
        if (!error)
            return;
    }
    fuse_reply_err(request, finished(t, error));
}

/* LISTXATTR: the names, each ending in a NUL (none for an archive without attributes).
 * One pass into a buffer of the longest list the format allows: a pass to size the
 * buffer and a second to fill it could meet a longer list if the archive changed in
 * place in between (the reviewer's ASan run overflowed a buffer sized by the first). */
static void ll_listxattr(fuse_req_t request, fuse_ino_t inode, size_t size)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(forest_of(request), inode, &t, &shard, &local);
    if (error) {
        fuse_reply_err(request, error);
        return;
    }
    XattrQuery q;
    memset(&q, 0, sizeof q);
    if ((q.names = malloc(XATTR_LIST_LIMIT)) == NULL) {
        fuse_reply_err(request, ENOMEM);
        return;
    }
    q.names_capacity = XATTR_LIST_LIMIT;
    error = tree_xattrs(t, local, &q);
    if (!error && size && size < q.names_length)
        error = ERANGE;
    if ((error = finished(t, error)) != 0)
        fuse_reply_err(request, error);
    else if (size == 0)
        fuse_reply_xattr(request, q.names_length);
    else
        fuse_reply_buf(request, (const char *) q.names, q.names_length);
    free(q.names);
}

static void ll_forget(fuse_req_t request, fuse_ino_t inode, uint64_t lookups)
{
    fuse_reply_none(request);  /* inodes are entry numbers: nothing to free */
}

static void ll_forget_multi(fuse_req_t request, size_t count, struct fuse_forget_data *forgets)
{
    fuse_reply_none(request);
}

static const struct fuse_lowlevel_ops operations = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .readlink = ll_readlink,
    .open = ll_open,
    .read = ll_read,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .statfs = ll_statfs,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
};

/* /proc/self/mountinfo's octal escapes (space, tab, newline, backslash), in place. */
static void unescape_mount_field(char *field)
{
    char *to = field;
    for (const char *from = field; *from; to++) {
        if (from[0] == '\\' && from[1] >= '0' && from[1] <= '3' && from[2] >= '0' && from[2] <= '7' && from[3] >= '0'
            && from[3] <= '7') {
            *to = (char) (((from[1] - '0') << 6) | ((from[2] - '0') << 3) | (from[3] - '0'));
            from += 4;
        } else {
            *to = *from++;
        }
    }
    *to = '\0';
}

/* The device ("major:minor") of the topmost mount at ``path`` (/proc/self/mountinfo,
 * whose later lines are mounts made later): 1 with it in ``device``, or 0. */
static int mount_device_at(const char *path, char *device, size_t size)
{
    FILE *info = path != NULL ? fopen("/proc/self/mountinfo", "re") : NULL;
    if (info == NULL)
        return 0;
    char *line = NULL;
    size_t room = 0;
    int found = 0;
    while (getline(&line, &room, info) > 0) {
        /* mount id, parent id, major:minor, root, mount point, then more */
        char *fields[5], *cursor = line;
        int count = 0;
        while (count < 5 && cursor != NULL) {
            fields[count++] = cursor;
            if ((cursor = strchr(cursor, ' ')) != NULL)
                *cursor++ = '\0';
        }
        if (count < 5 || cursor == NULL)
            continue;
        unescape_mount_field(fields[4]);
        if (strcmp(fields[4], path) == 0 && strlen(fields[2]) < size) {
            strcpy(device, fields[2]);
            found = 1;
        }
    }
    free(line);
    fclose(info);
    return found;
}

/* Unmount, give the signals back, free: the end of every session mount() started.
 * Only our own mount is unmounted: libfuse, run by root, detaches whatever is mounted
 * at the mount point, and a daemon stopped by a signal after its mount was detached
 * (packfs unmount --lazy while a file was open) took down the next mount made there,
 * another daemon's (issue 34).  So the topmost mount there must still be the one
 * this session made (its device), else nothing is unmounted; a mount that was not
 * found when it was made is unmounted as libfuse would. */
void end_session(Forest *f, struct fuse_session *session)
{
    char now[sizeof f->mount_device];
    if (f->mount_device[0] == '\0'
        || (mount_device_at(f->mount_path, now, sizeof now) && strcmp(now, f->mount_device) == 0))
        fuse_session_unmount(session);
    fuse_remove_signal_handlers(session);
    fuse_session_destroy(session);
    free(f->mount_path);
    f->mount_path = NULL;
    f->mount_device[0] = '\0';
}

int daemon_fuse_version(void)
{
    return fuse_version();
}

int daemon_mount(Forest *f, const char *mountpoint, const char *options, int debug, const char **why)
{
    char *argv[] = {"packfs", "-o", (char *) options, debug ? "-d" : NULL, NULL};
    struct fuse_args fuse_arguments = FUSE_ARGS_INIT(debug ? 4 : 3, argv);
    struct fuse_session *session = fuse_session_new(&fuse_arguments, &operations, sizeof operations, f);
    fuse_opt_free_args(&fuse_arguments);
    if (session == NULL) {
        *why = "libfuse refused the mount options";
        return -1;
    }
    if (fuse_set_signal_handlers(session) != 0) {
        fuse_session_destroy(session);
        *why = "cannot install the signal handlers";
        return -1;
    }
    char *resolved = realpath(mountpoint, NULL);  /* before mounting: after, it would ask this daemon */
    if (fuse_session_mount(session, mountpoint) != 0) {
        free(resolved);
        fuse_remove_signal_handlers(session);
        fuse_session_destroy(session);
        *why = "libfuse could not mount";
        return -1;
    }
    f->mount_path = resolved;
    if (!mount_device_at(resolved, f->mount_device, sizeof f->mount_device))
        f->mount_device[0] = '\0';
    f->session = session;
    return 0;
}

int daemon_run(Forest *f, int threads, int clone_fd, int idle)
{
    struct fuse_session *session = f->session;
    int status;
    if (threads == 1) {
        status = fuse_session_loop(session);
    } else {
#ifdef PACKFS_FUSE_312
        struct fuse_loop_config *config = fuse_loop_cfg_create();
        fuse_loop_cfg_set_clone_fd(config, (unsigned) clone_fd);
        if (idle >= 0)
            fuse_loop_cfg_set_idle_threads(config, (unsigned) idle);
        if (threads > 1)
            fuse_loop_cfg_set_max_threads(config, (unsigned) threads);
        status = fuse_session_loop_mt(session, config);
        fuse_loop_cfg_destroy(config);
#else
        struct fuse_loop_config config = {.clone_fd = clone_fd, .max_idle_threads = idle >= 0 ? idle : 10};
        status = fuse_session_loop_mt(session, &config);
#endif
    }
    /* A check another thread runs (a Python Tree.read) may still owe READs parked on it
     * their replies: they go to this session, so it ends only after them. */
    for (uint64_t s = 0; s < f->count; s++) {
        Tree *t = f->trees[s];
        pthread_mutex_lock(&t->checks_lock);
        while (t->claimed_count > 0)
            pthread_cond_wait(&t->check_ended, &t->checks_lock);
        pthread_mutex_unlock(&t->checks_lock);
    }
    end_session(f, session);
    return status;
}
