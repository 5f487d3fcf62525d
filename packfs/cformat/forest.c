/* A union of shards (a shard set, packfs.core.union) served as one tree: inode numbers
 * shifted by each shard's base, a directory several shards hold merged from its parts.
 *
 * Bytes read: none of its own; each part is read through its Tree (lookup.c, table.c):
 * a shared directory's parts' child ranges, their first and last names (the seams),
 * and their subdirectory counts.
 */

#include "forest.h"

#include "lookup.h"
#include "records.h"
#include "table.h"

#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

/* -- forests: several trees served as one (a shard set, packfs.core.union) ------------- */

/* A set's inode is a shard's inode offset by the shard's base (bases[s], the entries of
 * the shards before it), so (shard, the shard's own inode) is a binary search of the
 * bases away, and every request but those on a directory several shards hold goes to
 * one tree unchanged.  Such a *shared* directory (the root, and the directories above
 * where each shard begins) is reported under its canonical number (its entry in the
 * lowest-numbered shard holding it); its listing is its parts' children, part after part
 * in range order, a name equal to the previous part's last being a directory both hold,
 * listed once.  A single Tree is served as a forest of one (Tree.alone), so both take
 * the same path. */


/* Inode ``inode`` of the set: its tree, shard and the tree's own inode. */
static int locate(Forest *f, uint64_t inode, Tree **t, unsigned *shard, uint64_t *local)
{
    if (inode < 1 || inode - 1 >= f->bases[f->count])
        return EIO;  /* not an inode this daemon handed out */
    uint64_t entry = inode - 1, low = 0, high = f->count;  /* bases[low] <= entry < bases[high] */
    while (high - low > 1) {
        uint64_t middle = low + (high - low) / 2;
        if (f->bases[middle] <= entry)
            low = middle;
        else
            high = middle;
    }
    *t = f->trees[low];
    *shard = (unsigned) low;
    *local = entry - f->bases[low] + 1;
    return 0;
}

/* The shared directory whose part (or canonical entry) is the set's ``entry``, or NULL. */
static const Shared *shared_of(Forest *f, uint64_t entry)
{
    uint64_t low = 0, high = f->alias_count;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (f->aliases[middle].entry < entry)
            low = middle + 1;
        else
            high = middle;
    }
    return low < f->alias_count && f->aliases[low].entry == entry ? f->shared + f->aliases[low].shared : NULL;
}

static int compare_bytes(const uint8_t *a, size_t a_length, const uint8_t *b, size_t b_length)
{
    int order = memcmp(a, b, a_length < b_length ? a_length : b_length);
    return order ? order : (a_length > b_length) - (a_length < b_length);
}

/* Whether part ``p``'s first child (at ``start``) is part ``previous``'s last (its
 * children from ``previous_start``): a directory both hold, which both must hold as one. */
static int read_seam(const Part *previous, uint64_t previous_start, Part *p, uint64_t start)
{
    Tree *t = previous->tree;
    const uint8_t *name;
    uint64_t length, last = previous_start + previous->children - 1;
    int error = name_of(t, last, &name, &length);
    int same = !error && compare_bytes(name, length, p->first_name, p->first_length) == 0;
    unsigned type = S_IFDIR, other = S_IFDIR;
    if (!error && same)
        error = file_type(t, last, &type);
    if ((error = finished(t, error)) != 0 || !same)
        return error;
    if ((error = finished(p->tree, file_type(p->tree, start, &other))) != 0)
        return error;
    if (type != S_IFDIR || other != S_IFDIR)
        return broken(p->tree, start, 26, "has the name of another shard's entry, and they are not both directories");
    p->repeats = 1;
    return 0;
}

/* Shared directory ``d``'s parts, read: each one's child count and first child's name
 * (copied), where it begins in the merged listing, a name repeated at a seam, and the
 * merged nlink when none was given (2, and each part's subdirectories, a repeated one
 * once).  A part that cannot be read (its shard changed in place, or a broken rule,
 * logged) is served as empty but unread, so that the other shards' children stay
 * reachable: the directory's listing is EIO, and so is a LOOKUP of a name it may hold.
 * A seam that cannot be read is taken as no repeated name. */
static void read_parts(Forest *f, Shared *d)
{
    Part *parts = f->parts + d->first_part;
    const Part *previous = NULL;  /* the last part with children */
    uint64_t previous_start = 0, links = 2, before = 0;
    for (uint64_t i = 0; i < d->parts; i++) {
        Part *p = parts + i;
        Tree *t = p->tree;
        uint64_t start = 0, count = 0, length = 0;
        const uint8_t *name = NULL;
        int error = children_of(t, p->directory, &start, &count);
        if (!error && count)
            error = name_of(t, start, &name, &length);
        uint32_t stored = error ? 2 : COLUMN32(t, NLINK, p->directory);
        if (!error && count) {
            uint8_t *copy = malloc(length ? length : 1);
            if (copy == NULL)
                error = ENOMEM;
            else
                memcpy(copy, name, length);
            p->first_name = copy;
            p->first_length = length;
            p->owns_name = copy != NULL;
        }
        if ((error = finished(t, error)) != 0) {
            if (p->owns_name)
                free((void *) p->first_name);
            p->owns_name = 0;
            p->unread = d->unread = 1;
            count = 0;
            stored = 2;
        }
        p->children = count;
        p->before = before;
        /* Only the merged nlink depends on it: a value no directory of ``count`` children
         * can have is taken as the nearest one it can. */
        p->links = stored < 2 ? 2 : stored - 2 > count ? count + 2 : stored;
        if (previous != NULL && count && read_seam(previous, previous_start, p, start) != 0)
            p->repeats = 0;
        if (count == 0) {  /* an empty part: searched as if it began where the one before did */
            p->first_name = previous != NULL ? previous->first_name : (const uint8_t *) "";
            p->first_length = previous != NULL ? previous->first_length : 0;
        } else {
            previous = p;
            previous_start = start;
        }
        before += count;
        links += p->links - 2 - (p->repeats && p->links > 2);
    }
    /* A set's root has a part in every shard: the few values read of each mapped whole
     * folios (0.4 MiB a shard of 1.8 MiB, 380 MiB for 1,000 shards). */
    for (uint64_t i = 0; i < d->parts; i++) {
        if (parts[i].tree->guard >= 0)
            release_table(parts[i].tree);
    }
    d->children = before;
    if (d->nlink == 0)
        d->nlink = links;
}

/* Shared directory ``shared``'s parts, read at its first use rather than at mount (a
 * set of 1,000 shards spent 0.14 s of its mount checking the table pages they lie on).
 * Inside an operation, it gives the operation's page failures back. */
static void prepare_shared(Forest *f, const Shared *shared)
{
    Shared *d = (Shared *) shared;
    if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&f->prepare_lock);
    if (!d->ready) {
        int outer_failure = page_failure;
        page_failure = 0;
        read_parts(f, d);
        page_failure = outer_failure;
        __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&f->prepare_lock);
}

/* A shared directory's attributes: its canonical part's, with the merged nlink.  Run
 * inside another tree's operation, it ends its own (finished) and gives the operation's
 * page failures back. */
static int shared_stat(Forest *f, const Shared *d, struct stat *st)
{
    const Part *p = f->parts + d->canonical_part;
    prepare_shared(f, d);
    int outer_failure = page_failure;
    page_failure = 0;
    int error = finished(p->tree, entry_stat(p->tree, p->directory, st));
    page_failure = outer_failure;
    if (error)
        return error;
    st->st_ino = d->canonical + 1;
    st->st_nlink = d->nlink > UINT32_MAX ? UINT32_MAX : d->nlink;
    return 0;
}

/* Attributes a tree of shard ``shard`` made, in the set's numbering: its inode offset by
 * the base, a shared directory's canonical (with ``attributes``, its merged attributes;
 * if those fail, *attributes becomes 0: listed without them). */
static void export_stat(Forest *f, unsigned shard, struct stat *st, int *attributes)
{
    st->st_ino += f->bases[shard];
    if ((st->st_mode & S_IFMT) != S_IFDIR || f->shared_count == 0)
        return;
    const Shared *d = shared_of(f, st->st_ino - 1);
    if (d == NULL)
        return;
    if (*attributes) {
        struct stat merged;
        if (shared_stat(f, d, &merged) == 0)
            *st = merged;
        else
            *attributes = 0;
    }
    st->st_ino = d->canonical + 1;
}

/* Inode ``inode`` as one tree's: a shared directory is its canonical part (its
 * attributes, its extended attributes). */
int resolve(Forest *f, uint64_t inode, Tree **t, unsigned *shard, uint64_t *local)
{
    int error = locate(f, inode, t, shard, local);
    const Shared *d;
    if (!error && f->shared_count && (d = shared_of(f, inode - 1)) != NULL) {
        const Part *p = f->parts + d->canonical_part;
        *t = p->tree;
        *shard = p->shard;
        *local = p->directory + 1;
    }
    return error;
}

/* GETATTR, the change check included. */
int forest_getattr(Forest *f, uint64_t inode, struct stat *st)
{
    Tree *t;
    unsigned shard;
    uint64_t local;
    int error = locate(f, inode, &t, &shard, &local);
    if (error)
        return error;
    const Shared *d = f->shared_count ? shared_of(f, inode - 1) : NULL;
    if (d != NULL)
        return shared_stat(f, d, st);
    if ((error = tree_getattr(t, local, st)) == 0) {
        int attributes = 0;
        export_stat(f, shard, st, &attributes);
    }
    return error;
}

/* LOOKUP, the change check included.  In a shared directory, the one part whose
 * children may hold ``name``: the last whose first child's name is not after it (the
 * parts between it and the next with children are empty, or could not be read). */
int forest_lookup(Forest *f, uint64_t parent, const uint8_t *name, size_t length, struct stat *st)
{
    Tree *t;
    unsigned shard;
    uint64_t local;
    int error = locate(f, parent, &t, &shard, &local);
    if (error)
        return error;
    const Shared *d = f->shared_count ? shared_of(f, parent - 1) : NULL;
    int unread = 0;  /* a part of the directory that could not be read may hold the name */
    if (d != NULL) {
        if (length > MAX_NAME)
            return ENAMETOOLONG;
        prepare_shared(f, d);
        const Part *parts = f->parts + d->first_part;
        uint64_t low = 0, high = d->parts;  /* the first part whose first name is after ``name`` */
        while (low < high) {
            uint64_t middle = low + (high - low) / 2;
            if (compare_bytes(parts[middle].first_name, parts[middle].first_length, name, length) <= 0)
                low = middle + 1;
            else
                high = middle;
        }
        while (low > 0 && parts[low - 1].children == 0)
            unread |= parts[--low].unread;  /* an empty part carries its predecessor's first name */
        if (low == 0)
            return unread ? EIO : ENOENT;
        const Part *p = parts + low - 1;
        t = p->tree;
        shard = p->shard;
        local = p->directory + 1;
    }
    if ((error = tree_lookup_stat(t, local, name, length, st)) == ENOENT && unread)
        error = EIO;  /* a part that could not be read may hold it */
    if (!error) {
        int attributes = 1;
        export_stat(f, shard, st, &attributes);
        if (!attributes)
            error = EIO;  /* a shared directory whose canonical part's attributes broke a rule */
    }
    return error;
}

/* A shared directory's listing from ``offset``: positions 0 and 1 are "." and "..",
 * 2 + i the i-th child of the parts' children in order (a repeated name keeps its
 * position and is skipped), so offsets stay those of one fixed sequence. */
static int shared_listing(Forest *f, const Shared *d, uint64_t offset, int plus, uint64_t limit, ListingSink sink,
                          void *context)
{
    const Part *parts = f->parts + d->first_part, *canonical = f->parts + d->canonical_part;
    const Part *open = NULL;  /* the part being listed: its range checked, its operation not yet finished */
    char name[MAX_NAME + 1];
    uint64_t listed = 0, start = 0, count = 0;
    prepare_shared(f, d);
    int error = d->unread ? EIO : 0;
    for (uint64_t position = offset; !error && listed < limit; position++) {
        struct stat st;
        int attributes = 0;
        const Part *p = open;
        if (position < 2) {
            p = canonical;
            error = finished(p->tree, listing_item(p->tree, p->directory, 0, 0, position, 0, name, &st, &attributes));
        } else {
            uint64_t child = position - 2;
            if (child >= d->children)
                break;
            if (open == NULL || child < open->before || child - open->before >= open->children) {
                uint64_t low = 0, high = d->parts;  /* the last part with before <= child */
                while (high - low > 1) {
                    uint64_t middle = low + (high - low) / 2;
                    if (parts[middle].before <= child)
                        low = middle;
                    else
                        high = middle;
                }
                if (open != NULL) {
                    /* A part listed to its end: what its few entries mapped (whole folios)
                     * leaves RSS, which a listing of the root of 1,000 shards grew by 150 MiB. */
                    if (open->tree->guard >= 0)
                        release_table(open->tree);
                    if ((error = finished(open->tree, 0)) != 0) {
                        open = NULL;
                        break;
                    }
                }
                p = open = parts + low;
                error = children_of(p->tree, p->directory, &start, &count);
                if (!error && count != p->children)
                    error = broken(p->tree, p->directory, 25, "has another child count than when mounted");
                if (error)
                    break;
            }
            uint64_t i = child - p->before;
            if (i == 0 && p->repeats)
                continue;
            error = listing_item(p->tree, p->directory, start, count, 2 + i, plus, name, &st, &attributes);
        }
        if (error == LEFT_OUT) {
            error = 0;
            continue;
        }
        if (error)
            break;
        export_stat(f, p->shard, &st, &attributes);
        if (sink(context, name, &st, attributes, position + 1))
            break;
        listed++;
    }
    if (open != NULL) {
        touched(open->tree, listed + 1);
        error = finished(open->tree, error);
    }
    return error;
}

/* READDIR (READDIRPLUS with ``plus``) of inode ``inode`` from ``offset``: at most
 * ``limit`` entries handed to ``sink``, each with the offset after it; the change
 * check included. */
int forest_listing(Forest *f, uint64_t inode, uint64_t offset, int plus, uint64_t limit, ListingSink sink,
                          void *context)
{
    Tree *t;
    unsigned shard;
    uint64_t local;
    int error = locate(f, inode, &t, &shard, &local);
    if (error)
        return error;
    const Shared *d = f->shared_count ? shared_of(f, inode - 1) : NULL;
    if (d != NULL)
        return shared_listing(f, d, offset, plus, limit, sink, context);
    uint64_t directory, start, count, listed = 0;
    error = directory_of(t, local, &directory, &start, &count);
    char name[MAX_NAME + 1];
    for (uint64_t position = offset; !error && listed < limit; position++) {
        struct stat st;
        int attributes;
        error = listing_item(t, directory, start, count, position, plus, name, &st, &attributes);
        if (error == LEFT_OUT) {
            error = 0;
            continue;
        }
        if (error == ENOENT) {
            error = 0;
            break;
        }
        if (error)
            break;
        export_stat(f, shard, &st, &attributes);
        if (sink(context, name, &st, attributes, position + 1))
            break;
        listed++;
    }
    touched(t, listed + 1);
    return finished(t, error);
}

/* STATFS: the trees' sums; the change check of every tree. */
int forest_statfs(Forest *f, struct statvfs *st)
{
    memset(st, 0, sizeof *st);
    st->f_bsize = st->f_frsize = 4096;
    st->f_files = f->bases[f->count];
    st->f_namemax = MAX_NAME;
    int error = 0;
    for (uint64_t s = 0; s < f->count; s++) {
        st->f_blocks += f->trees[s]->blocks;
        if (finished(f->trees[s], 0))
            error = EIO;
    }
    return error;
}


int forest_of_one(Tree *t)
{
    if ((t->alone = calloc(1, sizeof(Forest))) == NULL)
        return ENOMEM;
    t->alone->one_tree = t;
    t->alone->trees = &t->alone->one_tree;
    t->alone->count = 1;
    t->alone->one_bases[1] = t->entries;
    t->alone->bases = t->alone->one_bases;
    t->alone->xattrs = t->xattr_entries != 0;
    return 0;
}
