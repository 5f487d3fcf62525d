/* Finding entries: a name in a directory (LOOKUP), a path (tree_find), a directory's
 * listing, an entry's attributes (stat) and its extended attributes.
 *
 * Bytes read: the path table's columns (format sections 2-3: mode, uid, gid, mtime_ns,
 * size, nlink, first_link, child_start, child_count, name_end, names, parent, and the
 * path_hash and path_entry index), in place through the map or with pread in a large
 * directory, and section 4c's attribute lists.  Every value is held to its rule of
 * section 5 where it is used (a child range inside the table and after its directory,
 * names sorted bytewise, ...).
 */

#include "lookup.h"

#include "records.h"
#include "table.h"

#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

/* The attributes the kernel takes (packfs.fuse.common.kernel_attributes, in C), held to
 * the rules of the data they describe: the kernel never sends a READ at or past
 * st_size, so a size READ would refuse must not reach it (a 12-byte file shown empty,
 * or 2**62 bytes long).  A hard-linked file's attributes are its inode's entry's
 * (first_link) under every name, each name's own record checked: the kernel keeps one
 * set per inode, the last it was given, so one name's wrong size would otherwise cut
 * the file short under all of them. */
int entry_stat(Tree *t, uint64_t entry, struct stat *st)
{
    uint32_t mode;
    uint64_t inode, record, start, end;
    int error = entry_mode(t, entry, &mode);
    unsigned type = mode & S_IFMT;
    if (!error)
        error = inode_of(t, entry, type, &inode);
    if (!error && type != S_IFDIR)
        error = contents_of(t, entry, type, &record, &start, &end);
    if (!error && inode != entry + 1) {
        /* The inode's entry: inode_of checked it is a regular file naming the same record;
         * the mode handed out is read (and checked) once more, here. */
        uint64_t name = entry;
        entry = inode - 1;
        mode = COLUMN32(t, MODE, entry);
        error = (mode & S_IFMT) != S_IFREG ? broken(t, name, 9, "has a first_link that is not an earlier name of "
                                                                "the same file")
                                           : contents_of(t, entry, S_IFREG, &record, &start, &end);
    }
    if (error)
        return error;
    memset(st, 0, sizeof *st);
    uint64_t size = COLUMN64(t, SIZE, entry);
    uint32_t uid = COLUMN32(t, UID, entry), gid = COLUMN32(t, GID, entry);
    int64_t mtime = (int64_t) COLUMN64(t, MTIME_NS, entry);
    if (size > (uint64_t) INT64_MAX)
        size = INT64_MAX;  /* the kernel answers EIO for a larger one */
    st->st_ino = inode;
    st->st_mode = mode;
    st->st_nlink = COLUMN32(t, NLINK, entry);
    st->st_uid = t->uid >= 0 ? (uid_t) t->uid : uid == UINT32_MAX ? UINT32_MAX - 1 : uid;  /* (uid_t)-1: no owner */
    st->st_gid = t->gid >= 0 ? (gid_t) t->gid : gid == UINT32_MAX ? UINT32_MAX - 1 : gid;
    if (t->umask >= 0)
        st->st_mode &= ~(mode_t) t->umask;
    st->st_size = (off_t) size;
    st->st_blocks = type == S_IFREG ? (blkcnt_t) ((size + 511) / 512) : 0;
    st->st_blksize = 128 * 1024;
    int64_t seconds = mtime / 1000000000, nanoseconds = mtime % 1000000000;
    if (nanoseconds < 0) {
        nanoseconds += 1000000000;
        seconds -= 1;
    }
    st->st_mtim.tv_sec = st->st_atim.tv_sec = st->st_ctim.tv_sec = seconds;
    st->st_mtim.tv_nsec = st->st_atim.tv_nsec = st->st_ctim.tv_nsec = nanoseconds;
    return 0;
}

/* -- operations ------------------------------------------------------------------------- */

/* ``count`` bytes of section ``k`` at file offset ``at`` (inside it) with pread, their
 * pages checked first. */
static int read_table(Tree *t, int k, uint8_t *buffer, uint64_t count, uint64_t at)
{
    return pages_ok(t, SECTION_REGION(k), at, at + count) ? EIO : read_exactly(t, buffer, count, at);
}

/* Where a table value in the map lies in the archive file. */
static inline uint64_t file_offset(Tree *t, const uint8_t *in_map)
{
    return (uint64_t) (in_map - t->base);
}

/* How the stored name at names[start, end) orders against ``name`` (<0, 0, >0, in
 * *order).  Its bytes are taken from ``names`` when they lie in names[names_from,
 * names_to) (read earlier in one go), else read with pread, at most MAX_NAME at a time. */
static int compare_name(Tree *t, uint64_t start, uint64_t end, const uint8_t *name, size_t length,
                        const uint8_t *names, uint64_t names_from, uint64_t names_to, int *order)
{
    uint8_t buffer[MAX_NAME];
    uint64_t other_length = end - start, common = other_length < length ? other_length : length;
    *order = 0;
    if (names != NULL && names_from <= start && end <= names_to) {
        *order = memcmp(names + (start - names_from), name, common);
        common = 0;
    }
    for (uint64_t done = 0; done < common && *order == 0;) {
        uint64_t piece = common - done < MAX_NAME ? common - done : MAX_NAME;
        int error = read_table(t, NAMES, buffer, piece, file_offset(t, t->column[NAMES]) + start + done);
        if (error)
            return error;
        *order = memcmp(buffer, name + done, piece);
        done += piece;
    }
    if (*order == 0)
        *order = other_length < length ? -1 : other_length > length ? 1 : 0;
    return 0;
}

/* The binary search of children [low, high) of ``directory`` for ``name``, through the
 * map: 0 and *found, ENOENT, or an error.  *steps: the entries it read. */
static int search_in_place(Tree *t, uint64_t directory, uint64_t low, uint64_t high, const uint8_t *name,
                           size_t length, uint64_t *found, uint64_t *steps)
{
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        const uint8_t *other;
        uint64_t other_length;
        int error = name_of(t, middle, &other, &other_length);
        ++*steps;
        if (error)
            return error;
        int order = memcmp(other, name, other_length < length ? other_length : length);
        if (order == 0)
            order = other_length < length ? -1 : other_length > length ? 1 : 0;
        if (order == 0) {
            if ((error = parent_is(t, middle, directory)) == 0)
                *found = middle;
            return error;
        }
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
    }
    return ENOENT;
}

/* ``directory``'s search top, taken over from the oldest if it has none; the caller
 * holds search_lock. */
static SearchTop *search_top_of(Tree *t, uint64_t directory)
{
    SearchTop *oldest = &t->search_tops[0];
    for (int i = 0; i < SEARCH_TOPS; i++) {
        SearchTop *top = &t->search_tops[i];
        if (top->directory == directory + 1) {
            top->used = ++t->search_clock;
            return top;
        }
        if (top->used < oldest->used)
            oldest = top;
    }
    oldest->directory = directory + 1;
    oldest->used = ++t->search_clock;
    for (unsigned k = 0; k < SEARCH_TOP_NODES; k++)
        oldest->node[k].end = 0;
    return oldest;
}

/* Keep node ``k`` of ``directory``'s search top (every thread reads the same one),
 * unless another directory has taken its place meanwhile. */
static void keep_node(Tree *t, uint64_t directory, unsigned k, const SearchNode *node)
{
    pthread_mutex_lock(&t->search_lock);
    for (int i = 0; i < SEARCH_TOPS; i++) {
        if (t->search_tops[i].directory == directory + 1)
            t->search_tops[i].node[k] = *node;
    }
    pthread_mutex_unlock(&t->search_lock);
}

/* How a kept name orders against ``name``, in *order, when its prefix decides: 1; else
 * (both go on past the prefix alike) 0, and the whole name must be compared. */
static int kept_order(const SearchNode *node, const uint8_t *name, size_t length, int *order)
{
    uint64_t stored = node->end - node->start, kept = stored < SEARCH_TOP_PREFIX ? stored : SEARCH_TOP_PREFIX;
    *order = memcmp(node->prefix, name, kept < length ? kept : length);
    if (*order == 0 && stored <= SEARCH_TOP_PREFIX)
        *order = stored < length ? -1 : stored > length ? 1 : 0;
    else if (*order == 0 && length < SEARCH_TOP_PREFIX)
        *order = 1;  /* it goes on where ``name`` ends */
    else if (*order == 0)
        return 0;
    return 1;
}

/* The same search with pread, for a large directory: it maps nothing.  A binary search
 * reads at scattered places, and a fault there maps a whole folio of the page cache
 * (up to 2 MiB: the 40 reads of one search among 1,000,000 names mapped 7.6 MiB), so
 * through the map 20,000 missing names took the daemon from 14 to 115 MiB.  Its first
 * levels come from the directory's search top (in one hold of search_lock while the
 * kept prefixes decide); the last read their name_end values, then their names, in one
 * go each. */
static int search_by_pread(Tree *t, uint64_t directory, uint64_t low, uint64_t high, const uint8_t *name,
                           size_t length, uint64_t *found)
{
    uint64_t ends[NAME_ENDS_AT_ONCE + 1], ends_from = UINT64_MAX, names_from = 0, names_to = 0;
    uint8_t names[NAMES_AT_ONCE];
    int have_names = 0, locked = 0, error = ENOENT;
    uint64_t name_end = file_offset(t, t->column[NAME_END]), names_at = file_offset(t, t->column[NAMES]);
    SearchTop *top = NULL;
    unsigned k = 0;  /* the node in the search top; SEARCH_TOP_NODES below it */
    while (low < high) {
        uint64_t middle = low + (high - low) / 2, span[2];
        int order;
        if (k < SEARCH_TOP_NODES) {
            if (!locked) {
                pthread_mutex_lock(&t->search_lock);
                top = search_top_of(t, directory);
                locked = 1;
            }
            SearchNode node = top->node[k];
            if (node.end == 0 || !kept_order(&node, name, length, &order)) {
                pthread_mutex_unlock(&t->search_lock);
                locked = 0;
                if (node.end == 0) {
                    if ((error = read_table(t, NAME_END, (uint8_t *) span, 16, name_end + 8 * (middle - 1))) != 0
                        || (error = name_span_ok(t, middle, span[0], span[1])) != 0)
                        break;
                    uint64_t kept = span[1] - span[0] < SEARCH_TOP_PREFIX ? span[1] - span[0] : SEARCH_TOP_PREFIX;
                    if ((error = read_table(t, NAMES, node.prefix, kept, names_at + span[0])) != 0)
                        break;
                    node.start = span[0];
                    node.end = span[1];
                    keep_node(t, directory, k, &node);
                }
                if (!kept_order(&node, name, length, &order)
                    && (error = compare_name(t, node.start, node.end, name, length, NULL, 0, 0, &order)) != 0)
                    break;
            }
        } else {
            if (locked) {
                pthread_mutex_unlock(&t->search_lock);
                locked = 0;
            }
            if (ends_from == UINT64_MAX && high - low <= NAME_ENDS_AT_ONCE) {
                /* children are never the root: low - 1 is an entry */
                if ((error = read_table(t, NAME_END, (uint8_t *) ends, 8 * (high - low + 1), name_end + 8 * (low - 1))) != 0)
                    break;
                ends_from = low - 1;
            }
            if (ends_from != UINT64_MAX && !have_names) {
                uint64_t first = ends[low - 1 - ends_from], last = ends[high - 1 - ends_from];
                if (first <= last && last <= t->names_size && last - first <= NAMES_AT_ONCE) {
                    if ((error = read_table(t, NAMES, names, last - first, names_at + first)) != 0)
                        break;
                    names_from = first;
                    names_to = last;
                    have_names = 1;
                }
            }
            if (ends_from != UINT64_MAX) {
                span[0] = ends[middle - 1 - ends_from];
                span[1] = ends[middle - ends_from];
            } else if ((error = read_table(t, NAME_END, (uint8_t *) span, 16, name_end + 8 * (middle - 1))) != 0) {
                break;
            }
            if ((error = name_span_ok(t, middle, span[0], span[1])) != 0
                || (error = compare_name(t, span[0], span[1], name, length, have_names ? names : NULL, names_from,
                                         names_to, &order)) != 0)
                break;
        }
        if (order == 0) {
            if (locked) {
                pthread_mutex_unlock(&t->search_lock);
                locked = 0;
            }
            if ((error = parent_is(t, middle, directory)) == 0)
                *found = middle;
            break;
        }
        error = ENOENT;
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
        k = k < SEARCH_TOP_NODES ? 2 * k + (order < 0 ? 2 : 1) : SEARCH_TOP_NODES;
        if (k > SEARCH_TOP_NODES)
            k = SEARCH_TOP_NODES;
    }
    if (locked)
        pthread_mutex_unlock(&t->search_lock);
    return error;
}

/* Entry of ``name`` in directory inode ``parent``: 0 and *found, or an errno.  A
 * directory whose children's name_end values and names span at most IN_PLACE_SEARCH
 * bytes is searched through the map (that span is the most its lookups can map); a
 * larger one with pread. */
int tree_lookup(Tree *t, uint64_t parent, const uint8_t *name, size_t length, uint64_t *found)
{
    uint64_t directory, low, count;
    int error = entry_of(t, parent, &directory);
    if (!error)
        error = children_of(t, directory, &low, &count);
    if (error)
        return error;
    if (length > MAX_NAME)
        return ENAMETOOLONG;  /* as a disk's file system answers: never listed (name_fit) */
    if (count == 0)
        return ENOENT;
    uint64_t high = low + count, steps = 0;
    uint64_t first = COLUMN64(t, NAME_END, low - 1), last = COLUMN64(t, NAME_END, high - 1);
    if (first <= last && last - first + 8 * count <= IN_PLACE_SEARCH) {
        error = search_in_place(t, directory, low, high, name, length, found, &steps);
        touched(t, steps);
        return error;
    }
    return search_by_pread(t, directory, low, high, name, length, found);
}

/* Position ``position`` of directory ``directory``'s listing: 0 is ".", 1 is "..",
 * 2 + i its i-th child.  ENOENT past the end, LEFT_OUT for a child not listed (a name
 * over MAX_NAME).  With ``plus`` (READDIRPLUS), *attributes is 1 when ``st`` holds the
 * child's attributes; 0 for . and .., without ``plus``, and for a child whose
 * attributes break a rule: it is listed by name, type
 * and inode alone, and its LOOKUP answers EIO, so that one bad entry neither hides its
 * directory nor reaches the kernel with a wrong size. */
int listing_item(Tree *t, uint64_t directory, uint64_t start, uint64_t count, uint64_t position,
                        int plus, char *name, struct stat *st, int *attributes)
{
    memset(st, 0, sizeof *st);
    st->st_mode = S_IFDIR;
    *attributes = 0;
    if (position == 0) {
        strcpy(name, ".");
        st->st_ino = directory + 1;
        return 0;
    }
    if (position == 1) {
        uint64_t up = directory ? COLUMN32(t, PARENT, directory) : 0;  /* the root's ".." is itself */
        if (up >= directory && directory)
            return broken(t, directory, 10, "has a parent that is not before it");
        strcpy(name, "..");
        st->st_ino = up + 1;
        return 0;
    }
    if (position - 2 >= count)
        return ENOENT;
    uint64_t child = start + position - 2;
    const uint8_t *bytes;
    uint64_t length;
    int error = name_of(t, child, &bytes, &length);
    if (!error)
        error = name_fit(t, child, bytes, length);
    if (!error)
        error = parent_is(t, child, directory);
    if (error)
        return error;
    /* A plain READDIR hands the kernel a name, a type and an inode: the attributes' columns
     * (and the header's offsets) are not read, so a cold walk reads 5 of the table's 15
     * sections, not 11 and the header. */
    *attributes = plus && entry_stat(t, child, st) == 0;
    if (!*attributes) {
        unsigned type;
        uint64_t inode;
        if ((error = file_type(t, child, &type)) != 0 || (error = inode_of(t, child, type, &inode)) != 0)
            return error;
        memset(st, 0, sizeof *st);
        st->st_mode = type;
        st->st_ino = inode;
    }
    memcpy(name, bytes, length);
    name[length] = 0;
    return 0;
}
/* GETATTR: inode ``inode``'s attributes, the change check included. */
int tree_getattr(Tree *t, uint64_t inode, struct stat *st)
{
    uint64_t entry;
    int error = entry_of(t, inode, &entry);
    if (!error)
        error = entry_stat(t, entry, st);
    return finished(t, error);
}

/* LOOKUP: the attributes of ``name`` in directory inode ``parent``, the change check
 * included (ENOENT when it is not there). */
int tree_lookup_stat(Tree *t, uint64_t parent, const uint8_t *name, size_t length, struct stat *st)
{
    uint64_t child;
    int error = tree_lookup(t, parent, name, length, &child);
    if (!error) {
        error = entry_stat(t, child, st);
        touched(t, 1);  /* the entry's attributes */
    }
    return finished(t, error);
}

/* A listing's directory: inode ``inode``'s entry and child range. */
int directory_of(Tree *t, uint64_t inode, uint64_t *directory, uint64_t *start, uint64_t *count)
{
    int error = entry_of(t, inode, directory);
    return error ? error : children_of(t, *directory, start, count);
}

/* An attribute name as format section 4c allows it: a known namespace and at least one
 * byte more, no NUL (the length is checked by the caller). */
static int xattr_name_ok(const uint8_t *name, size_t length)
{
    static const char *spaces[] = {"user.", "security.", "trusted.", "system."};
    if (memchr(name, 0, length))
        return 0;
    for (int k = 0; k < 4; k++) {
        size_t prefix = strlen(spaces[k]);
        if (length > prefix && memcmp(name, spaces[k], prefix) == 0)
            return 1;
    }
    return 0;
}


/* Inode ``inode``'s attribute list (format section 4c: kept under the inode's entry, so
 * every name of a hard-linked file answers alike), parsed whole and checked as section 5
 * says whatever is asked: a list that breaks a rule is EIO for every question. */
int tree_xattrs(Tree *t, uint64_t inode, XattrQuery *q)
{
    uint64_t entry;
    int error = entry_of(t, inode, &entry);
    if (error || t->xattr_entries == 0)
        return error;
    if (t->xattrs_damaged)
        return EIO;  /* logged at mount */
    uint64_t low = 0, high = t->xattr_entries;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (checked_u32(t, XATTR_REGION(0), t->xattr_entry + 4 * middle) < entry)
            low = middle + 1;
        else
            high = middle;
    }
    if (low == t->xattr_entries || checked_u32(t, XATTR_REGION(0), t->xattr_entry + 4 * low) != entry)
        return page_failure ? EIO : 0;
    uint64_t at = checked_u64(t, XATTR_REGION(1), t->xattr_start + 8 * low);
    uint64_t end = checked_u64(t, XATTR_REGION(1), t->xattr_start + 8 * (low + 1));
    if (at > end || end > t->xattr_size)
        return broken(t, entry, 20, "has extended attributes outside their section");
    uint64_t data_at = (uint64_t) (t->xattr_data - t->base);
    if (page_failure || pages_ok(t, XATTR_REGION(2), data_at + at, data_at + end))
        return EIO;
    const uint8_t *previous = NULL;
    size_t previous_length = 0;
    while (at < end) {
        if (end - at < XATTR_HEADER)
            return broken(t, entry, 21, "has an extended attribute cut short");
        const uint8_t *item = t->xattr_data + at;
        size_t name_length = item[0];
        uint32_t value_length = u32_at(item + 1);
        at += XATTR_HEADER;
        if (value_length > XATTR_VALUE_LIMIT || name_length + (uint64_t) value_length > end - at)
            return broken(t, entry, 21, "has an extended attribute cut short");
        const uint8_t *name = t->xattr_data + at;
        if (!xattr_name_ok(name, name_length))
            return broken(t, entry, 22, "has an extended attribute name outside user., security., trusted., system.");
        if (previous != NULL) {
            size_t common = name_length < previous_length ? name_length : previous_length;
            int order = memcmp(previous, name, common);
            if (order > 0 || (order == 0 && previous_length >= name_length))
                return broken(t, entry, 23, "has extended attribute names out of order or repeated");
        }
        if (q->names_length + name_length + 1 > XATTR_LIST_LIMIT)
            return broken(t, entry, 24, "has extended attribute names of more than 65536 bytes");
        if (q->names != NULL) {
            if (q->names_length + name_length + 1 > q->names_capacity)
                return EIO;  /* a list longer than the buffer made for it */
            memcpy(q->names + q->names_length, name, name_length);
            q->names[q->names_length + name_length] = 0;
        }
        q->names_length += name_length + 1;
        if (q->wanted != NULL && name_length == q->wanted_length && memcmp(name, q->wanted, name_length) == 0) {
            q->value = name + name_length;
            q->value_length = value_length;
            q->found = 1;
        }
        previous = name;
        previous_length = name_length;
        at += name_length + value_length;
    }
    return 0;
}

/* Whether entry ``entry``'s full path (format section 4: names from the root down,
 * joined by '/') is ``path``: compared from its last name up, each parent below its
 * child (section 5), so the walk ends. */
static int path_is(Tree *t, uint64_t entry, const uint8_t *path, size_t length, int *same)
{
    *same = 0;
    size_t end = length;
    for (uint64_t steps = 0; entry != 0; steps++) {
        const uint8_t *name;
        uint64_t name_length;
        int error = name_of(t, entry, &name, &name_length);
        if (error)
            return error;
        if (name_length > end || memcmp(path + end - name_length, name, (size_t) name_length) != 0)
            return 0;
        end -= (size_t) name_length;
        uint64_t parent = COLUMN32(t, PARENT, entry);
        if (parent >= entry)
            return broken(t, entry, 49, "names a parent that is not before it");
        if (parent != 0) {
            if (end == 0 || path[end - 1] != '/')
                return 0;
            end--;
        }
        entry = parent;
    }
    *same = end == 0;
    return 0;
}

/* The entry whose stored path is exactly ``path`` (canonical, as packfs.core's
 * Archive.find takes it: no leading or trailing slash, symlinks not followed), by a
 * binary search of path_hash and a comparison of each candidate's full path: ENOENT if
 * there is none. */
int tree_find(Tree *t, const uint8_t *path, size_t length, uint64_t *found)
{
    uint32_t hash = (uint32_t) crc32(crc32(0L, Z_NULL, 0), path, (uInt) length);
    uint64_t low = 0, high = t->entries;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (COLUMN32(t, PATH_HASH, middle) < hash)
            low = middle + 1;
        else
            high = middle;
    }
    for (uint64_t j = low; j < t->entries && COLUMN32(t, PATH_HASH, j) == hash && !page_failure; j++) {
        uint64_t entry = COLUMN32(t, PATH_ENTRY, j);
        if (entry >= t->entries)
            return broken(t, entry, 50, "is named by a path_entry value beyond the table");
        int same, error = path_is(t, entry, path, length, &same);
        if (error)
            return error;
        if (same) {
            *found = entry;
            return 0;
        }
    }
    return page_failure ? EIO : ENOENT;
}
