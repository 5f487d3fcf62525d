/* The archive's header and path table: opening (tree_open) and the rules each value
 * is held to where it is used.
 *
 * Bytes read: the header (format section 1: the record count, then the data records'
 * CRCs and offsets, through the map, each offset's page checked first), the path
 * table's fifteen columns (sections 2-3), the spans of sections 4b, 4c and 4f (their
 * first and last index values), and with format 1.4's page checks (section 4e) every
 * page of those regions, with pread, against the tail's CRCs before any value in it is
 * used.  packfs/format.py's docstring is the specification; the section numbers are its.
 * Nothing read is trusted: every value is checked, where it is used, against the rule
 * of section 5 that makes that use safe, and a broken rule answers EIO, logged once.
 */

#include "table.h"

#include "codecs.h"
#include "crc.h"
#include "records.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* -- logging (to log_fd: stderr, the daemon's log file, by default) ---------------------- */

/* One stamped line to log_fd; the caller holds log_lock. */
static void write_log_line(Tree *t, const char *format, va_list args)
{
    struct timespec now;
    struct tm local;
    char stamp[32], line[1024];
    clock_gettime(CLOCK_REALTIME, &now);
    localtime_r(&now.tv_sec, &local);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    int used = snprintf(line, sizeof line, "%s,%03ld packfs: ", stamp, now.tv_nsec / 1000000);
    vsnprintf(line + used, sizeof line - (size_t) used - 1, format, args);
    size_t length = strlen(line);
    line[length++] = '\n';
    if (write(t->log_fd, line, length) < 0) {
        /* nowhere left to say it */
    }
}

/* A problem found: logged once per ``key`` (a bit per hash of it), MAX_LOG_LINES at most. */
void log_line(Tree *t, uint64_t key, const char *format, ...)
{
    pthread_mutex_lock(&t->log_lock);
    uint32_t bit = (uint32_t) ((key * 0x9E3779B97F4A7C15ull) >> 48);
    if (t->log_lines < MAX_LOG_LINES && !(t->log_seen[bit >> 3] & (1u << (bit & 7)))) {
        t->log_seen[bit >> 3] |= (uint8_t) (1u << (bit & 7));
        t->log_lines++;
        va_list args;
        va_start(args, format);
        write_log_line(t, format, args);
        va_end(args);
    }
    pthread_mutex_unlock(&t->log_lock);
}

/* The notice that tells the operator what to do: always written, past the cap and with
 * no bit of its own that another key could share (its caller writes it once). */
static void log_notice(Tree *t, const char *format, ...)
{
    pthread_mutex_lock(&t->log_lock);
    va_list args;
    va_start(args, format);
    write_log_line(t, format, args);
    va_end(args);
    pthread_mutex_unlock(&t->log_lock);
}

/* Set when the operation running on this thread used a value from a page that failed
 * its check (pages_ok): the value read as 0, and the operation's answer is EIO whatever
 * it made of it (finished), as a truncated map's zeros are.  Reset by finished. */
__thread int page_failure;
__thread int checksum_failure;

/* A broken rule of the table: EIO, logged once per entry and rule (unless it came from
 * a damaged page's zeros: that page was logged). */
int broken(Tree *t, uint64_t entry, int rule, const char *what)
{
    if (page_failure)
        return EIO;
    log_line(t, entry * 64 + (uint64_t) rule, "'%s': invalid path table: entry %llu %s", t->name,
             (unsigned long long) entry, what);
    return EIO;
}

static const char *region_name(unsigned region)
{
    static const char *names[PAGED_REGIONS_CODECS] = {
        "the header's record CRCs", "the header's record offsets", "section 'parent'", "section 'mode'",
        "section 'uid'", "section 'gid'", "section 'mtime_ns'", "section 'size'", "section 'record'",
        "section 'child_start'", "section 'child_count'", "section 'name_end'", "section 'nlink'",
        "section 'first_link'", "section 'names'", "section 'path_hash'", "section 'path_entry'",
        "section 'piece_record'", "section 'piece_start'", "section 'piece_crc'", "section 'xattr_entry'",
        "section 'xattr_start'", "section 'xattr_data'", "section 'record_codec'", "section 'codec_data'"};
    return names[region];
}

/* Check page ``page`` of region ``region`` against the tail's CRC (the first use of a
 * value in it; pages_ok): 0, or EIO (logged once, remembered) and page_failure set.
 * Threads may check the same page together: both find the same answer. */
int check_page(Tree *t, unsigned region, uint64_t page)
{
    uint64_t index = t->region_first[region] + page, size = (uint64_t) 1 << t->page_shift;
    if (!bit_of(t->page_failed, index)) {
        uint64_t start = t->region_start[region] + (page << t->page_shift);
        uint64_t end = t->region_end[region] - start < size ? t->region_end[region] : start + size;
        uint64_t window = (start - t->region_start[region]) / PREFETCH_BYTES;
        uint64_t window_bit = t->region_window[region] + window;
        if (!bit_of(t->page_prefetched, window_bit)) {
            /* the rest of this window and the next: read ahead while this page is checked */
            set_bit(t->page_prefetched, window_bit);
            uint64_t until = t->region_start[region] + (window + 2) * PREFETCH_BYTES;
            posix_fadvise(t->fd, (off_t) start, (off_t) ((until < t->region_end[region] ? until
                                                                 : t->region_end[region]) - start),
                          POSIX_FADV_WILLNEED);
        }
        /* Read with pread, not through the map: a check maps nothing (a lookup's search
         * by pread must not grow the daemon's RSS by the pages it checks). */
        uint8_t *buffer = malloc(end - start);
        if (buffer == NULL) {
            page_failure = 1;
            return ENOMEM;
        }
        int error = read_exactly(t, buffer, end - start, start);
        uint32_t crc = error ? 0 : crc_update(0, buffer, (size_t) (end - start));
        free(buffer);
        if (error) {
            page_failure = 1;
            return error;
        }
        if ((uint32_t) crc == t->page_crc[index]) {
            set_bit(t->page_checked, index);
            return 0;
        }
        if (!tree_changed(t)) {
            log_line(t, ((uint64_t) 1 << 60) + index, "'%s': %s is damaged: checksum mismatch in bytes [%llu, %llu) "
                     "(stored %#010x, computed %#010x): what uses them answers EIO", t->name, region_name(region),
                     (unsigned long long) start, (unsigned long long) end, t->page_crc[index], (unsigned) crc);
            set_bit(t->page_failed, index);
        }
    }
    page_failure = 1;
    return checksum_eio();
}

int tree_changed(Tree *t)
{
    if (__atomic_load_n(&t->changed, __ATOMIC_RELAXED))
        return 1;
    int reason;
    if (t->guard >= 0) {
        reason = t->guard_check(t->guard);
    } else {
        struct stat now;
        reason = fstat(t->fd, &now) != 0 ? 3
                 : (now.st_dev != t->identity.st_dev || now.st_ino != t->identity.st_ino
                    || now.st_size != t->identity.st_size
                    || now.st_mtim.tv_sec != t->identity.st_mtim.tv_sec
                    || now.st_mtim.tv_nsec != t->identity.st_mtim.tv_nsec) ? 2 : 0;
    }
    if (reason == 0)
        return 0;
    if (!__atomic_exchange_n(&t->changed, reason, __ATOMIC_RELAXED))
        log_notice(t, "'%s': archive changed in place (%s); remount: every request now answers EIO", t->name,
                   reason == 1 ? "truncated under its map" : reason == 2 ? "overwritten or replaced" : "fstat failed");
    return 1;
}

/* Count ``entries`` read from the table; past RELEASE_EVERY, drop the header's and
 * the table's mapped pages from RSS (a later use maps them again from the page cache). */
void release_table(Tree *t);

void touched(Tree *t, uint64_t entries)
{
    if (__atomic_add_fetch(&t->touched, entries, __ATOMIC_RELAXED) < RELEASE_EVERY)
        return;
    __atomic_store_n(&t->touched, 0, __ATOMIC_RELAXED);
    release_table(t);
}

/* The header's and the table's mapped pages, out of RSS (they stay in the page cache);
 * a forest's releases only a guarded map's (the fuzzers' trees read a heap buffer, which
 * MADV_DONTNEED would zero). */
void release_table(Tree *t)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t) t->base;
    uintptr_t header_end = (base + t->header_end + (uintptr_t) page - 1) & ~((uintptr_t) page - 1);
    madvise((void *) base, header_end - base, MADV_DONTNEED);
    if (t->table_high > t->table_low)
        madvise((void *) t->table_low, t->table_high - t->table_low, MADV_DONTNEED);
}

/* -- the table's rules, where each value is used (format section 5) ------------------ */

int entry_of(Tree *t, uint64_t inode, uint64_t *entry)
{
    if (inode < 1 || inode - 1 >= t->entries)
        return EIO;  /* not an inode this daemon handed out */
    *entry = inode - 1;
    return 0;
}

/* Entry ``entry``'s mode, read once and its file type checked: a mode handed out is
 * the one checked, not a second read of the column. */
int entry_mode(Tree *t, uint64_t entry, uint32_t *mode)
{
    *mode = COLUMN32(t, MODE, entry);
    unsigned kind = *mode & S_IFMT;
    if (kind != S_IFDIR && kind != S_IFREG && kind != S_IFLNK)
        return broken(t, entry, 1, "has a file type that is not a directory, file or symlink");
    return 0;
}

int file_type(Tree *t, uint64_t entry, unsigned *type)
{
    uint32_t mode;
    int error = entry_mode(t, entry, &mode);
    *type = mode & S_IFMT;
    return error;
}

/* Inode ``inode``'s entry and file type. */
int typed_entry(Tree *t, uint64_t inode, uint64_t *entry, unsigned *type)
{
    int error = entry_of(t, inode, entry);
    return error ? error : file_type(t, *entry, type);
}

/* A name's span [start, end) of the names section: inside it, non-empty for every
 * entry but the root. */
int name_span_ok(Tree *t, uint64_t entry, uint64_t start, uint64_t end)
{
    if (start > end || end > t->names_size || (entry && start == end))
        return broken(t, entry, 2, "has a name outside the names section, or an empty one");
    return 0;
}

/* Bytes [from, to) of section ``k`` (inside it), their pages checked: 0 or EIO. */
static inline int table_bytes_ok(Tree *t, int k, uint64_t from, uint64_t to)
{
    uint64_t at = (uint64_t) (t->column[k] - t->base);
    return pages_ok(t, SECTION_REGION(k), at + from, at + to);
}

/* The name's bytes, in place. */
int name_of(Tree *t, uint64_t entry, const uint8_t **name, uint64_t *length)
{
    uint64_t start = entry ? COLUMN64(t, NAME_END, entry - 1) : 0;
    uint64_t end = COLUMN64(t, NAME_END, entry);
    int error = name_span_ok(t, entry, start, end);
    if (!error)
        error = table_bytes_ok(t, NAMES, start, end);
    if (error)
        return error;
    *name = t->column[NAMES] + start;
    *length = end - start;
    return 0;
}

/* A name handed to the kernel: no '/', no NUL, not "." or ".."; and at most MAX_NAME
 * bytes, else LEFT_OUT (logged once): format section 5 makes that no reason to fail
 * the whole directory. */
int name_fit(Tree *t, uint64_t entry, const uint8_t *name, uint64_t length)
{
    if (memchr(name, '/', length) || memchr(name, 0, length)
        || (length == 1 && name[0] == '.') || (length == 2 && name[0] == '.' && name[1] == '.'))
        return broken(t, entry, 3, "has a name that holds '/' or NUL, or is . or ..");
    if (length > MAX_NAME) {
        log_line(t, entry * 64 + 14, "'%s': entry %llu has a name of %llu bytes, longer than %d (NAME_MAX): left "
                 "out of its directory's listing", t->name, (unsigned long long) entry, (unsigned long long) length,
                 MAX_NAME);
        return LEFT_OUT;
    }
    return 0;
}

/* A directory's child range: after it, within the table. */
int children_of(Tree *t, uint64_t entry, uint64_t *start, uint64_t *count)
{
    unsigned type;
    int error = file_type(t, entry, &type);
    if (error)
        return error;
    if (type != S_IFDIR)
        return ENOTDIR;
    *start = COLUMN32(t, CHILD_START, entry);
    *count = COLUMN32(t, CHILD_COUNT, entry);
    if (*count && (*start <= entry || *start + *count > t->entries))
        return broken(t, entry, 4, "has a child range that is not after it and within the table");
    return 0;
}

/* A child found in a directory's range must name it as its parent. */
int parent_is(Tree *t, uint64_t child, uint64_t directory)
{
    if (COLUMN32(t, PARENT, child) != directory)
        return broken(t, child, 5, "is in a directory's child range but names another parent");
    return 0;
}

/* The end of every operation: EIO if the archive changed in place or a value it used
 * was on a damaged page (page_failure, reset here for the thread's next operation). */
int finished(Tree *t, int error)
{
    int damaged = page_failure;
    page_failure = 0;
    return tree_changed(t) || damaged ? EIO : error;
}
/* -- opening: the spans packfs.core found, checked again before any is used ---------- */

/* Sets ``message`` (the caller's TreeSpans.error) and answers EINVAL: a span or count
 * that breaks a rule of format sections 1-4 (Python raises ValueError with it). */
static int refused(TreeSpans *spans, const char *format, ...) __attribute__((format(printf, 2, 3)));

static int refused(TreeSpans *spans, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(spans->error, sizeof spans->error, format, args);
    va_end(args);
    return EINVAL;
}

/* Format 1.4's page checks (page_size, the regions' spans, their page CRCs, u32 region
 * after region, and data_end, all from the checked tail), each checked to fit the
 * archive and the header before any is used: 23 regions, or 25 in a 1.5 archive with
 * codecs, whose sections 22 and 23 are paged too.  With checks off only data_end is
 * taken: nothing is checked. */
static int open_pages(Tree *t, TreeSpans *spans, unsigned paged_regions)
{
    uint64_t page_size = spans->page_size;
    if (page_size < 65536 || page_size > ((uint64_t) 1 << 31) || (page_size & (page_size - 1))
        || spans->region_count != paged_regions)
        return refused(spans, "pages: the page size or the number of regions is wrong");
    t->paged_regions = paged_regions;
    uint64_t count = 0, windows = 0;
    for (unsigned r = 0; r < paged_regions; r++) {
        uint64_t start = spans->regions[r][0], end = spans->regions[r][1];
        if (start > end || end > t->file_size)
            return refused(spans, "pages: region %u does not fit the archive", r);
        t->region_start[r] = start;
        t->region_end[r] = end;
        t->region_first[r] = count;
        t->region_window[r] = windows;
        count += (end - start + page_size - 1) / page_size;
        windows += (end - start + PREFETCH_BYTES - 1) / PREFETCH_BYTES;
    }
    /* The header's two regions are where section 1 puts the data records' CRCs and offsets. */
    uint64_t offsets = 12 + 4 * t->records;
    if (t->region_start[HEADER_CRCS] != 12 || t->region_end[HEADER_CRCS] != 12 + 4 * t->data_records
        || t->region_start[HEADER_OFFSETS] != offsets
        || t->region_end[HEADER_OFFSETS] != offsets + 8 * (t->data_records + 1))
        return refused(spans, "pages: the header's regions are not the data records' CRCs and offsets");
    if (spans->page_crc_bytes != 4 * count)
        return refused(spans, "pages: %llu bytes of page CRCs, the regions have %llu pages",
                       (unsigned long long) spans->page_crc_bytes, (unsigned long long) count);
    if (spans->data_end < t->header_end || spans->data_end > t->file_size)
        return refused(spans, "pages: the data area's end is outside the archive");
    t->data_end = spans->data_end;
    if (spans->check_once) {
        t->page_crc = malloc(count ? 4 * count : 1);
        t->page_checked = calloc(count / 8 + 1, 1);
        t->page_failed = calloc(count / 8 + 1, 1);
        t->page_prefetched = calloc(windows / 8 + 1, 1);
        if (t->page_crc == NULL || t->page_checked == NULL || t->page_failed == NULL || t->page_prefetched == NULL)
            return ENOMEM;
        memcpy(t->page_crc, spans->page_crcs, 4 * count);
        t->pages = count;
        t->page_shift = (unsigned) __builtin_ctzll(page_size);
    }
    return 0;
}

/* With page checks: section ``k`` (0 .. 20) must be its region, so every value read of
 * it lies in a region the tail has CRCs of. */
static int section_is_region(Tree *t, TreeSpans *spans, int k, uint64_t start, uint64_t end)
{
    if (t->page_crc == NULL || (t->region_start[SECTION_REGION(k)] == start && t->region_end[SECTION_REGION(k)] == end))
        return 0;
    return refused(spans, "section %d's span is not the tail's", k);
}

/* Three spans of sections after the table, each inside the archive. */
static int three_spans(Tree *t, TreeSpans *spans, const char *what, const uint64_t span[3][2])
{
    for (int k = 0; k < 3; k++) {
        if (span[k][0] > span[k][1] || span[k][1] > t->file_size)
            return refused(spans, "%s section %d's span does not fit the archive", what, k);
    }
    return 0;
}

/* Section 4b's three spans, checked to fit the archive and each other, so that every
 * index pieces_of() and read_pieces() make is in bounds. */
static int open_pieces(Tree *t, TreeSpans *spans)
{
    const uint64_t (*span)[2] = (const uint64_t (*)[2]) spans->pieces;
    int error = three_spans(t, spans, "piece", span);
    if (error)
        return error;
    uint64_t count = (span[0][1] - span[0][0]) / 8;
    if ((span[0][1] - span[0][0]) % 8 || count > t->data_records || span[1][1] - span[1][0] != 8 * (count + 1))
        return refused(spans, "the piece_record and piece_start sections do not agree");
    uint64_t total = checked_u64(t, PIECE_REGION(1), t->base + span[1][0] + 8 * count);
    if (page_failure) {
        page_failure = 0;
        return refused(spans, "section 'piece_start' is damaged (logged)");
    }
    if ((span[2][1] - span[2][0]) % 4 || (span[2][1] - span[2][0]) / 4 != total)
        return refused(spans, "the piece_crc section does not hold piece_start's count");
    for (int k = 0; k < 3; k++) {
        if ((error = section_is_region(t, spans, 15 + k, span[k][0], span[k][1])) != 0)
            return error;
    }
    t->piece_record = t->base + span[0][0];
    t->piece_start = t->base + span[1][0];
    t->piece_crc = t->base + span[2][0];
    /* At most the archive's size / 32 bytes: section 17 holds 4 bytes per piece. */
    if ((t->piece_checked = calloc(total / 8 + 1, 1)) == NULL || (t->piece_failed = calloc(total / 8 + 1, 1)) == NULL)
        return ENOMEM;
    t->piece_records = count;
    t->piece_total = total;
    return 0;
}

/* Section 4c's three spans, checked to fit the archive and each other (format section
 * 5's open rules), so that every index tree_xattrs() makes is in bounds. */
static int open_xattrs(Tree *t, TreeSpans *spans)
{
    const uint64_t (*span)[2] = (const uint64_t (*)[2]) spans->xattrs;
    int error = three_spans(t, spans, "attribute", span);
    if (error)
        return error;
    uint64_t count = (span[0][1] - span[0][0]) / 4, size = span[2][1] - span[2][0];
    if ((span[0][1] - span[0][0]) % 4 || count > t->entries || span[1][1] - span[1][0] != 8 * (count + 1))
        return refused(spans, "the xattr_entry, xattr_start and xattr_data sections do not agree");
    for (int k = 0; k < 3; k++) {
        if ((error = section_is_region(t, spans, 18 + k, span[k][0], span[k][1])) != 0)
            return error;
    }
    uint64_t first = checked_u64(t, XATTR_REGION(1), t->base + span[1][0]);
    uint64_t last = checked_u64(t, XATTR_REGION(1), t->base + span[1][0] + 8 * count);
    if (page_failure) {
        page_failure = 0;
        return refused(spans, "section 'xattr_start' is damaged (logged)");
    }
    if (first != 0 || last != size)
        return refused(spans, "the xattr_entry, xattr_start and xattr_data sections do not agree");
    t->xattr_entry = t->base + span[0][0];
    t->xattr_start = t->base + span[1][0];
    t->xattr_data = t->base + span[2][0];
    t->xattr_entries = count;
    t->xattr_size = size;
    return 0;
}

/* Section 4f's two spans: record_codec a row per data record, codec_data anywhere in
 * the archive; with page checks, each its region (23 and 24). */
static int open_codecs(Tree *t, TreeSpans *spans)
{
    for (int k = 0; k < 2; k++) {
        uint64_t start = spans->codecs[k][0], end = spans->codecs[k][1];
        if (start > end || end > t->file_size)
            return refused(spans, "codec section %d's span does not fit the archive", k);
        if (t->page_crc != NULL && (t->region_start[RECORD_CODEC_REGION + k] != start
                                    || t->region_end[RECORD_CODEC_REGION + k] != end))
            return refused(spans, "section %d's span is not the tail's", 22 + k);
    }
    if (spans->codecs[0][1] - spans->codecs[0][0] != CODEC_ROW * t->data_records)
        return refused(spans, "the record_codec section is not a row per data record");
    t->record_codec = t->base + spans->codecs[0][0];
    t->codec_data = t->base + spans->codecs[1][0];
    t->codec_data_size = spans->codecs[1][1] - spans->codecs[1][0];
    return 0;
}

void tree_prepare(Tree *t)
{
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->uid = t->gid = t->umask = -1;
}

int tree_open(Tree *t, TreeSpans *spans)
{
    spans->error[0] = '\0';
#ifdef PACKFS_NO_ZSTD
    if (spans->has_codecs)
        return refused(spans, "built without libzstd (libzstd-dev): it cannot read format 1.5's codecs");
#endif
    if ((t->name = strdup(spans->name != NULL ? spans->name : "archive")) == NULL)
        return ENOMEM;
    t->base = spans->base;
    t->file_size = spans->size;
    /* What a page check needs (it reads with pread, logs, and asks tree_changed). */
    t->guard = spans->guard;
    t->guard_check = spans->guard_check;
    if (t->guard >= 0 && t->guard_check == NULL)
        return refused(spans, "a guarded map needs its check");
    t->fd = fcntl(spans->fd, F_DUPFD_CLOEXEC, 0);
    if (t->fd < 0 || fstat(t->fd, &t->identity) != 0)
        return errno ? errno : EBADF;
    t->log_fd = spans->log_fd;
    pthread_mutex_init(&t->log_lock, NULL);
    pthread_mutex_init(&t->search_lock, NULL);
    pthread_mutex_init(&t->checks_lock, NULL);
    pthread_cond_init(&t->check_ended, NULL);
    t->locks_made = 1;
    /* The header's own rules (section 1), again: every later index relies on them. */
    uint64_t records = spans->records, data_records = spans->data_records, entries = spans->entries;
    if (t->file_size < 12 || records < 1 || records > (t->file_size - 12) / 12)
        return refused(spans, "the record count does not fit the archive");
    t->records = records;
    t->header_end = 12 + 12 * records;
    if (data_records >= records || entries < 1 || entries > UINT32_MAX)
        return refused(spans, "data_records or entries out of range");
    t->data_records = data_records;
    t->entries = entries;
    int error;
    if (spans->has_pages) {
        if ((error = open_pages(t, spans, spans->has_codecs ? PAGED_REGIONS_CODECS : PAGED_REGIONS)) != 0)
            return error;
    } else {
        t->data_end = offset_of(t, data_records);
    }
    if (t->data_end < t->header_end || t->data_end > t->file_size)
        return refused(spans, "the data area's end is outside the archive");
    for (int k = 0; k < SECTIONS; k++) {
        uint64_t start = spans->sections[k][0], end = spans->sections[k][1];
        if (start > end || end > t->file_size || (k != NAMES && end - start != entries * (uint64_t) item_size[k]))
            return refused(spans, "section %d's span does not fit the archive", k);
        if ((error = section_is_region(t, spans, k, start, end)) != 0)
            return error;
        t->column[k] = t->base + start;
        if (k == 0 || (uintptr_t) t->base + start < t->table_low)
            t->table_low = (uintptr_t) t->base + start;
        if ((uintptr_t) t->base + end > t->table_high)
            t->table_high = (uintptr_t) t->base + end;
        if (k == NAMES)
            t->names_size = end - start;
    }
    if (spans->has_pieces && (error = open_pieces(t, spans)) != 0)
        return error;
    if (spans->has_xattrs && (error = open_xattrs(t, spans)) != 0)
        return error;
    if (spans->has_codecs && (error = open_codecs(t, spans)) != 0)
        return error;
    long page = sysconf(_SC_PAGESIZE);
    t->table_low &= ~((uintptr_t) page - 1);  /* whole pages: the map starts on one */
    t->table_high &= ~((uintptr_t) page - 1);  /* the last partial page stays */
    t->check_once = spans->check_once;
    t->check_always = spans->check_once && spans->check_always;
    if ((t->search_tops = calloc(SEARCH_TOPS, sizeof(SearchTop))) == NULL)
        return ENOMEM;
    if (spans->shared_checked != NULL && spans->shared_failed != NULL) {
        t->checked = spans->shared_checked;
        t->failed = spans->shared_failed;
        t->bitmaps_shared = 1;
    } else {
        t->checked = calloc(data_records / 8 + 1, 1);
        t->failed = calloc(data_records / 8 + 1, 1);
    }
    if (t->checked == NULL || t->failed == NULL)
        return ENOMEM;
    t->blocks = (t->file_size + 4095) / 4096;
    t->initialised = 1;
    return 0;
}

void tree_close(Tree *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    if (!t->bitmaps_shared) {
        free(t->checked);
        free(t->failed);
    }
    free(t->piece_checked);
    free(t->piece_failed);
    free(t->page_crc);
    free(t->page_checked);
    free(t->page_failed);
    free(t->page_prefetched);
    free(t->name);
    free(t->search_tops);
    if (t->record_codec != NULL)
        forget_decoded(t);
    forget_dictionaries(t);
    if (t->locks_made) {
        pthread_mutex_destroy(&t->log_lock);
        pthread_mutex_destroy(&t->search_lock);
        pthread_mutex_destroy(&t->checks_lock);
        pthread_cond_destroy(&t->check_ended);
    }
    tree_prepare(t);
}
