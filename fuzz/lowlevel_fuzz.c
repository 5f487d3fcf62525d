/* libFuzzer target: the compiled daemon (packfs/_lowlevel.c) over any archive.
 *
 * An input is a whole archive.  Each is opened as packfs.core opens it for the daemon
 * (daemon.h: layout_of, then the Tree type's own constructor), twice: checksums "once"
 * and "never" (an unchecked table is what the per-use checks stand alone against; this
 * pass with -o uid=,gid=,umask=,direct_io too), and walked through the FUSE callbacks
 * (walk_tree: every listing, lookup, getattr, read, readlink, open and attribute
 * request a bounded walk reaches, and more), each reply checked, and the first time
 * through the Tree's Python methods as well; then its file is truncated, and every
 * request must answer EIO (walk_changed).  Before that, the "once" pass serves the archive
 * twice as one set whose root both hold (walk_forest: a packfs._lowlevel.Forest of two).
 *
 * Most random changes to an archive only break what opening refuses, so the mutator
 * knows the container (format section 1) and the sections (2-4c): it puts values on
 * either side of a limit a table value is checked against (format section 5: a name's
 * end, a child range, a record's pieces, an attribute list, a symlink's length, a data
 * record's end; in a 1.5 archive a codec row's fields and a frame table's or extent
 * list's values, section 4f), sets a table item to a value that matters (another
 * entry's, a count, an edge), rewrites one record (its length may change: the container is laid out
 * again, sections kept 64-byte aligned), moves an offset, changes the footer or
 * damages a data byte; then, half the time, recomputes every CRC, so a changed record
 * is read, not refused by its CRC.  One time in thirteen it is libFuzzer's plain byte
 * mutation instead, and one in thirteen a byte of the page plan.
 *
 * A format 1.4 input is served with page checks as its page plan says (daemon.h:
 * page_geometry, the footer's last 8 bytes; 0 in a real archive): right CRCs for every
 * page but those the plan names, or a hostile geometry tree_init must refuse.  Beside
 * that Tree, one over the same bytes without page checks answers each request too
 * (ASK): with page checks the answer must be the same, or EIO where a page's CRC is
 * wrong, and no byte of such a page is read through the map (it is poisoned).
 *
 *   make fuzz-c FUZZ_C_SECONDS=3600     # fuzz/campaign.py runs it and prints the counts
 */

#include "daemon.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    daemon_setup();
    return 0;
}

/* The archive changes in place (its file truncated, as `cp new.ffr` over it does
 * first): from then on every request answers EIO (the map, here a copy, still reads
 * the old bytes; tree_changed() sees the file's size, and reads come up short). */
static void walk_changed(Walk *w, uint64_t file_inode)
{
    if (ftruncate(archive_fd(NULL, 0), (off_t) (w->size / 2)) != 0)
        violation("ftruncate: %s", strerror(errno));
    struct fuse_req r;
    for (int op = 0; op < 9; op++) {
        begin(&r, w->tree);
        switch (op) {
        case 0: ll_getattr(&r, 1, NULL); break;
        case 1: ll_lookup(&r, 1, "a"); break;
        case 2: ll_read(&r, file_inode, 4096, 0, &(struct fuse_file_info){0}); break;
        case 3: ll_readdirplus(&r, 1, LISTING_PAGE, 0, &(struct fuse_file_info){0}); break;
        case 4: ll_readdir(&r, 1, LISTING_PAGE, 2, &(struct fuse_file_info){0}); break;
        case 5: ll_readlink(&r, file_inode); break;
        case 6: ll_listxattr(&r, 1, 0); break;
        case 7: ll_getxattr(&r, 1, "user.a", 0); break;
        default: ll_statfs(&r, 1); break;
        }
        if (r.replies != 1 || r.kind != REPLY_ERR || r.error != EIO)
            violation("operation %d after the archive changed: reply %d, errno %d, expected EIO", op, r.kind,
                      r.error);
        end(&r);
    }
}

/* With page checks on (format 1.4, the input's page plan: daemon.h's page_geometry),
 * tree_init refuses a hostile geometry, takes a right one wherever it takes the archive
 * without page checks (unless a page it checks at open, piece_start's or xattr_start's
 * last, is wrong), and takes nothing without page checks refuses.  Returns the Tree to
 * walk into ``served`` (the one with page checks, else the one without), and the other,
 * if any, into ``reference``; 0 if neither was taken. */
static int serve_paged(Served *served, Served *reference, const uint8_t *data, size_t size, const Layout *layout,
                       const Pages *pages)
{
    int paged = serve(served, data, size, layout, 1, pages);
    keep_archive_file = 1;
    int plain = serve(reference, data, size, layout, 1, NULL);
    keep_archive_file = 0;
    if (paged && pages->hostile)
        violation("tree_init took a hostile page geometry (plan %#llx)", (unsigned long long) layout->plan);
    if (paged && !plain)
        violation("tree_init took with page checks what it refuses without them");
    if (!paged && plain && !pages->hostile && pages->wrong_count == 0)
        violation("tree_init refused a right page geometry (plan %#llx)", (unsigned long long) layout->plan);
    if (!paged) {
        unserve(served);
        *served = *reference;
        memset(reference, 0, sizeof *reference);
    }
    return served->tree != NULL;
}

/* The archive served twice as one set whose root both trees hold (daemon.h: walk_forest). */
static void walk_as_set(const uint8_t *data, size_t size, const Layout *layout, Tree *first)
{
    Served second;
    keep_archive_file = 1;
    int taken = serve(&second, data, size, layout, 1, NULL);
    keep_archive_file = 0;
    PyObject *forest = taken ? forest_of_two(first, second.tree) : NULL;
    if (forest != NULL) {
        Walk w = {.data = data, .size = size, .tree = first};
        walk_forest(&w, &((ForestObject *) forest)->forest, 0);
        Py_DECREF(forest);
    }
    unserve(&second);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Layout layout;
    if (!layout_of(data, size, &layout))
        return -1;  /* not an archive the daemon would be given: not worth keeping */
    Pages pages;
    int paged = page_geometry(data, size, &layout, &pages);
    for (int check_once = 1; check_once >= 0; check_once--) {
        Served served, reference = {0};
        /* Checksums "never" takes only data_end of the page checks (a geometry it
         * refuses is the "once" pass's to test). */
        const Pages *given = paged && (check_once || !pages.hostile) ? &pages : NULL;
        int taken = check_once && given ? serve_paged(&served, &reference, data, size, &layout, given)
                                        : serve(&served, data, size, &layout, check_once, given);
        if (!taken) {
            unserve(&served);
            unserve(&reference);
            continue;
        }
        Tree *t = served.tree;
        if (!check_once) {  /* -o uid=,gid=,umask=,direct_io, as packfs mount passes them */
            t->uid = 1000;
            t->gid = 100;
            t->umask = 027;
            t->direct_io = 1;
        }
        Walk w = {.data = data, .size = size, .tree = t, .python = check_once, .reference = reference.tree,
                  .damaged_pages = given ? given->wrong_count : 0};
        walk_tree(&w);
        if (check_once)
            walk_as_set(data, size, &layout, t);
        if (check_once)
            walk_changed(&w, 2);
        unserve(&served);
        unserve(&reference);
    }
    if (paged)
        pages_free(&pages);
    return 0;
}

/* -- the structure-aware mutator ------------------------------------------------------- */

typedef struct {
    uint64_t state;
} Random;

static uint64_t next(Random *r)  /* splitmix64 */
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t below(Random *r, uint64_t bound)
{
    return bound ? next(r) % bound : 0;
}

/* A container whose offsets are in order: record r is [start(r), end(r)). */
typedef struct {
    const uint8_t *data;
    size_t size;
    uint64_t n;
} Container;

static int container_of(const uint8_t *data, size_t size, Container *c)
{
    if (size < 12)
        return 0;
    uint64_t n = u64_at(data + 4);
    if (n < 1 || n > (size - 12) / 12)
        return 0;
    uint64_t previous = 12 + 12 * n;
    for (uint64_t r = 0; r < n; r++) {
        uint64_t start = u64_at(data + 12 + 4 * n + 8 * r);
        if (start < previous || start > size)
            return 0;
        previous = start;
    }
    c->data = data;
    c->size = size;
    c->n = n;
    return 1;
}

static uint64_t start_of(const Container *c, uint64_t r)
{
    return u64_at(c->data + 12 + 4 * c->n + 8 * r);
}

static uint64_t end_of(const Container *c, uint64_t r)
{
    return r + 1 < c->n ? start_of(c, r + 1) : c->size;
}

/* Every record's CRC where its offsets give it a span, and the header's. */
static void seal(uint8_t *data, size_t size)
{
    if (size < 12)
        return;
    uint64_t n = u64_at(data + 4);
    if (n < 1 || n > (size - 12) / 12)
        return;
    uint64_t header = 12 + 12 * n;
    for (uint64_t r = 0; r < n; r++) {
        uint64_t start = u64_at(data + 12 + 4 * n + 8 * r);
        uint64_t end = r + 1 < n ? u64_at(data + 12 + 4 * n + 8 * (r + 1)) : size;
        if (header <= start && start <= end && end <= size) {
            uint32_t crc = (uint32_t) crc32(crc32(0L, Z_NULL, 0), data + start, (uInt) (end - start));
            memcpy(data + 12 + 4 * r, &crc, 4);
        }
    }
    uint32_t meta = (uint32_t) crc32(crc32(0L, Z_NULL, 0), data + 4, (uInt) (header - 4));
    memcpy(data, &meta, 4);
}

/* The archive again with record ``changed`` replaced by ``bytes`` (``length`` of them),
 * laid out back to back with each section's padding record sized so that the section
 * starts at a multiple of 64 (format section 2), into ``out``; its size, or 0 if it
 * does not fit ``max_size``. */
static size_t relayout(const Container *c, const Layout *layout, uint64_t changed, const uint8_t *bytes,
                       size_t length, uint8_t *out, size_t max_size)
{
    uint64_t n = c->n, header = 12 + 12 * n, position = header;
    uint64_t sections = layout ? (layout->records - 1 - layout->data_records) / 2 : 0;
    static uint8_t *copy;  /* one buffer, kept: a fresh one of megabytes costs page faults each time */
    static size_t copy_size;
    if (copy_size < max_size) {
        free(copy);
        if ((copy = malloc(max_size)) == NULL) {
            copy_size = 0;
            return 0;
        }
        copy_size = max_size;
    }
    memcpy(copy, c->data, header);
    for (uint64_t r = 0; r < n; r++) {
        const uint8_t *from = c->data + start_of(c, r);
        uint64_t size = end_of(c, r) - start_of(c, r);
        if (r == changed) {
            from = bytes;
            size = length;
        }
        int padding = layout && r >= layout->data_records && r < layout->data_records + 2 * sections
                      && (r - layout->data_records) % 2 == 0;
        if (padding) {
            from = NULL;
            size = (64 - position % 64) % 64;
        }
        if (position + size > max_size)
            return 0;
        memcpy(copy + 12 + 4 * n + 8 * r, &position, 8);
        if (from != NULL)
            memcpy(copy + position, from, size);
        else
            memset(copy + position, 0, size);
        position += size;
    }
    memcpy(out, copy, position);
    return (size_t) position;
}

/* The item sizes of sections 0..20 (format sections 4, 4b, 4c), then of 22 and 23 (4f),
 * taken as u64s (a codec row is two, a frame table row two, an extent two). */
static int item_size_of(int k)
{
    static const int more[8] = {8, 8, 4, 4, 8, 1, 8, 8};
    return k < SECTIONS ? item_size[k] : more[k - SECTIONS];
}

static unsigned long long *span_of(Layout *layout, int k)
{
    return k < SECTIONS ? layout->table[k] : k < SECTIONS + 3 ? layout->pieces[k - SECTIONS]
                                           : k < SECTIONS + 6 ? layout->xattrs[k - SECTIONS - 3]
                                                              : layout->codecs[k - SECTIONS - 6];
}

/* A value that matters for an item of section ``k``: an edge, a count, another item's. */
static uint64_t telling_value(Random *r, const Layout *layout, const uint8_t *data, const unsigned long long *span,
                              int k, int size, uint64_t current)
{
    uint64_t items = (span[1] - span[0]) / (uint64_t) size;
    uint64_t other = 0;
    if (items) {
        const uint8_t *at = data + span[0] + (uint64_t) size * below(r, items);
        other = size == 8 ? u64_at(at) : size == 4 ? u32_at(at) : at[0];
    }
    switch (below(r, 14)) {
    case 0: return below(r, 4);
    case 1: return layout->entries - 1 + below(r, 3);
    case 2: return layout->data_records - 1 + below(r, 3);
    case 3: return other;
    case 4: return other + 1;
    case 5: return other - 1;
    case 6: return current + 1;
    case 7: return current - 1;
    case 8: return UINT64_MAX >> below(r, 2);
    case 9: return (uint64_t) 1 << below(r, 64);
    case 10: {
        static const unsigned modes[] = {S_IFDIR | 0755, S_IFREG | 0644, S_IFLNK | 0777, S_IFCHR | 0600,
                                         S_IFIFO | 0600, 0};
        return k == MODE ? modes[below(r, 6)] : k == NAMES ? "/.\0a\xff"[below(r, 5)] : next(r);
    }
    case 11: return layout->records - below(r, 3);
    case 12: return PIECE_SIZE + below(r, 3) - 1;
    default: return next(r);
    }
}

/* Item ``index`` of section ``k`` (NULL if the section's span or the index is out of the
 * archive). */
static uint8_t *item_at(uint8_t *data, size_t size, Layout *layout, int k, uint64_t index)
{
    unsigned long long *span = span_of(layout, k);
    uint64_t item = (uint64_t) item_size_of(k);
    if (span[0] > span[1] || span[1] > size || index >= (span[1] - span[0]) / item)
        return NULL;
    return data + span[0] + item * index;
}

static void put(uint8_t *at, uint64_t value, int size)
{
    if (at != NULL)
        memcpy(at, &value, (size_t) size);
}

/* Values on either side of one of format section 5's limits, the ones each use of a
 * table value is checked against: a name's end at the names section's end, a child
 * range at the table's end, a record's pieces at the piece CRCs' end (with the right
 * count), an attribute list at the attribute data's end, a symlink's target at 4,095
 * bytes, a data record's end at the data area's end. */
static void edge(Random *r, uint8_t *data, size_t size, Container *c, Layout *layout)
{
    int64_t delta = (int64_t) below(r, 5) - 2;
    uint64_t entries = layout->entries;
    switch (below(r, layout->has_codecs ? 9 : 6)) {
    case 0: {
        unsigned long long *names = layout->table[NAMES];
        put(item_at(data, size, layout, NAME_END, below(r, entries)), names[1] - names[0] + (uint64_t) delta, 8);
        break;
    }
    case 1: {
        uint64_t entry = below(r, entries), count = 1 + below(r, 3);
        put(item_at(data, size, layout, MODE, entry), S_IFDIR | 0755, 4);
        put(item_at(data, size, layout, CHILD_START, entry), entries - count + (uint64_t) delta, 4);
        put(item_at(data, size, layout, CHILD_COUNT, entry), count, 4);
        break;
    }
    case 2: {
        if (!layout->has_pieces)
            break;
        unsigned long long *records = layout->pieces[0], *crcs = layout->pieces[2];
        uint64_t listed = records[0] <= records[1] && records[1] <= size ? (records[1] - records[0]) / 8 : 0;
        uint64_t j = below(r, listed), count = below(r, 4);
        uint8_t *record = item_at(data, size, layout, SECTIONS, j);
        if (record == NULL || crcs[0] > crcs[1])
            break;
        uint64_t which = u64_at(record);
        if (which < layout->data_records)
            count = (end_of(c, which) - start_of(c, which) + PIECE_SIZE - 1) / PIECE_SIZE;
        uint64_t to = (crcs[1] - crcs[0]) / 4 + (uint64_t) delta;
        put(item_at(data, size, layout, SECTIONS + 1, j), to - count, 8);
        put(item_at(data, size, layout, SECTIONS + 1, j + 1), to, 8);
        break;
    }
    case 3: {
        if (!layout->has_xattrs)
            break;
        unsigned long long *values = layout->xattrs[2], *listed = layout->xattrs[0];
        uint64_t count = listed[0] <= listed[1] ? (listed[1] - listed[0]) / 4 : 0;
        put(item_at(data, size, layout, SECTIONS + 4, 1 + below(r, count)), values[1] - values[0] + (uint64_t) delta,
            8);
        break;
    }
    case 4: {  /* a symlink's target at MAX_SYMLINK_TARGET bytes, its record and size made to agree */
        for (uint64_t tries = 0, entry = below(r, entries); tries < 64; tries++, entry = (entry + 1) % entries) {
            uint8_t *mode = item_at(data, size, layout, MODE, entry), *record = item_at(data, size, layout, RECORD, entry);
            if (mode == NULL || record == NULL || (u32_at(mode) & S_IFMT) != S_IFLNK || u64_at(record) >= c->n - 1)
                continue;
            uint64_t which = u64_at(record), length = MAX_SYMLINK_TARGET + (uint64_t) delta;
            put(data + 12 + 4 * c->n + 8 * (which + 1), start_of(c, which) + length, 8);
            put(item_at(data, size, layout, SIZE, entry), length, 8);
            break;
        }
        break;
    }
    case 5: {
        uint64_t record = below(r, layout->data_records);
        if (record + 1 < c->n && layout->data_records < c->n)
            put(data + 12 + 4 * c->n + 8 * (record + 1), start_of(c, layout->data_records) + (uint64_t) delta, 8);
        break;
    }
    case 6: {  /* a codec row's field at a value its rules turn on (format section 4f) */
        uint8_t *row = item_at(data, size, layout, SECTIONS + 6, 2 * below(r, layout->data_records));
        unsigned long long *codec_data = layout->codecs[1];
        if (row == NULL)
            break;
        switch (below(r, 7)) {
        case 0: row[0] = (uint8_t) below(r, 6); break;
        case 1: row[1] = (uint8_t) (FRAME_LOG2_MIN - 1 + below(r, 7)); break;
        case 2: row[2 + below(r, 2)] = 1; break;
        case 3: row[4] ^= 1; break;
        case 4: put(row + 8, below(r, 2) ? NO_RECORD : below(r, layout->data_records + 1), 8); break;
        case 5: put(row + 8, codec_data[1] - codec_data[0] + (uint64_t) (8 * delta), 8); break;
        default: put(row + 8, 8 * below(r, (codec_data[1] - codec_data[0]) / 8 + 1), 8); break;
        }
        break;
    }
    default: {  /* a frame table's or extent list's u64 at a limit: a record's length, the file's end */
        unsigned long long *codec_data = layout->codecs[1];
        uint8_t *at = item_at(data, size, layout, SECTIONS + 7, below(r, (codec_data[1] - codec_data[0]) / 8 + 1));
        uint64_t record = below(r, layout->data_records), value;
        switch (below(r, 5)) {
        case 0: value = end_of(c, record) - start_of(c, record) + (uint64_t) delta; break;
        case 1: {
            const uint8_t *file_size = item_at(data, size, layout, SIZE, below(r, entries));
            value = (file_size != NULL ? u64_at(file_size) : 0) + (uint64_t) delta;
            break;
        }
        case 2: value = below(r, 4); break;
        case 3: value = (uint64_t) 1 << below(r, 64); break;
        default: value = at != NULL ? u64_at(at) + (uint64_t) delta : 0; break;
        }
        put(at, value, 8);
        break;
    }
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    Random r = {seed};
    Container c;
    Layout layout;
    int archive = container_of(data, size, &c) && layout_of(data, size, &layout);
    unsigned choice = (unsigned) below(&r, 26);
    if (!archive || choice < 2)
        return LLVMFuzzerMutate(data, size, max_size);
    if (choice >= 24) {  /* one byte of the page plan (daemon.h: page_geometry), nothing else */
        uint8_t *plan = data + start_of(&c, c.n - 1) + 56;
        plan[below(&r, 8)] = (uint8_t) (below(&r, 2) ? below(&r, 8) : next(&r));
        return size;
    }
    if (choice < 7) {  /* a value at one of the table's limits */
        edge(&r, data, size, &c, &layout);
    } else if (choice < 13) {  /* one table item */
        /* 1.3 has both; 1.5 with codecs has them and its two codec sections */
        int k = (int) below(&r, SECTIONS + 3 * layout.has_pieces + 3 * layout.has_xattrs + 2 * layout.has_codecs);
        unsigned long long *span = span_of(&layout, k);
        int item = item_size_of(k);
        if (span[0] > span[1] || span[1] > size || span[1] - span[0] < (uint64_t) item)
            return LLVMFuzzerMutate(data, size, max_size);
        uint64_t at = span[0] + (uint64_t) item * below(&r, (span[1] - span[0]) / (uint64_t) item);
        uint64_t current = item == 8 ? u64_at(data + at) : item == 4 ? u32_at(data + at) : data[at];
        uint64_t value = telling_value(&r, &layout, data, span, k, item, current);
        memcpy(data + at, &value, (size_t) item);
    } else if (choice < 17) {  /* one record rewritten; the container laid out again */
        uint64_t record = below(&r, 4) == 0 ? below(&r, c.n)
                                            : layout.data_records + below(&r, c.n - layout.data_records);
        uint64_t length = end_of(&c, record) - start_of(&c, record);
        size_t room = (size_t) (length * 2 + 64);
        uint8_t *bytes = malloc(room);
        if (bytes == NULL)
            return LLVMFuzzerMutate(data, size, max_size);
        if (below(&r, 4) == 0 && c.n > 1) {  /* another record's bytes */
            uint64_t from = below(&r, c.n);
            length = end_of(&c, from) - start_of(&c, from);
            if (length > room)
                length = room;
            memcpy(bytes, data + start_of(&c, from), (size_t) length);
        } else {
            memcpy(bytes, data + start_of(&c, record), (size_t) length);
            length = LLVMFuzzerMutate(bytes, (size_t) length, room);
        }
        size_t made = relayout(&c, &layout, record, bytes, (size_t) length, data, max_size);
        free(bytes);
        if (made == 0)
            return LLVMFuzzerMutate(data, size, max_size);
        size = made;
    } else if (choice < 19) {  /* an offset */
        uint64_t record = below(&r, c.n), other = below(&r, c.n);
        uint64_t values[] = {start_of(&c, other), start_of(&c, other) + 1, start_of(&c, other) - 1,
                             12 + 12 * c.n, size, size + 1, start_of(&c, record) + below(&r, 64),
                             start_of(&c, record) - below(&r, 64)};
        uint64_t value = values[below(&r, sizeof values / sizeof *values)];
        memcpy(data + 12 + 4 * c.n + 8 * record, &value, 8);
    } else if (choice < 21) {  /* a footer field */
        uint8_t *footer = data + start_of(&c, c.n - 1);
        static const int fields[][2] = {{10, 2}, {12, 4}, {16, 8}, {24, 8}, {32, 4}};
        int f = (int) below(&r, 5);
        uint64_t current = 0, value;
        memcpy(&current, footer + fields[f][0], (size_t) fields[f][1]);
        switch (below(&r, 4)) {
        case 0: value = current + 1; break;
        case 1: value = current - 1; break;
        case 2: value = below(&r, 4); break;
        default: value = next(&r); break;
        }
        memcpy(footer + fields[f][0], &value, (size_t) fields[f][1]);
    } else {  /* a data byte damaged */
        uint64_t start = 12 + 12 * c.n, end = start_of(&c, layout.data_records < c.n ? layout.data_records : 0);
        if (end > start)
            data[start + below(&r, end - start)] ^= (uint8_t) (1u << below(&r, 8));
        return size;  /* its CRC no longer matches: that is the point */
    }
    if (below(&r, 2))
        seal(data, size);
    return size;
}
