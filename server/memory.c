/* memory — does the model fit before it is loaded?
 *
 * Linux lets a process allocate more than the machine has and kills it with SIGKILL when
 * the pages are touched: loading a model too big for the box (a quantised file widened to
 * F32, a --kv-cache-mb above what is free, a container started with --memory) would end
 * without a word. So before loading, the server adds up what it will hold (model_plan's
 * weights and load peak, the engine's KV cache and buffers, a base for the process)
 * and compares it with what the machine and its cgroup leave: a clear error instead.
 *
 * What is available: /proc/meminfo's MemAvailable, and under a memory limit (cgroup v2
 * memory.max of the process's cgroup or any above it; v1 hierarchical_memory_limit) the
 * limit less the cgroup's usage, not counting its file cache (the kernel reclaims it
 * before it kills: the model file's own pages among them). The smaller wins. Every file
 * is read under a root folder, "" for the real ones, so that tests can lay out a machine
 * of their own. */
#include "server/server.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MEM_UNLIMITED (UINT64_C(1) << 60) /* cgroup v1 writes "unlimited" as ~2^63 */
#define MEM_PROCESS_BASE ((size_t)128 << 20) /* libraries, thread stacks, BLAS buffers,
                                              * connections: what no plan counts */

/* The whole of root + path (at most cap - 1 bytes), or NULL. */
static char *read_text(const char *root, const char *path, char *buf, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof full, "%s%s", root, path);
    FILE *f = fopen(full, "r");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* read_text of dir/name. */
static char *read_in(const char *root, const char *dir, const char *name, char *buf, size_t cap)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof path ? read_text(root, path, buf, cap) : NULL;
}

/* The number after `key` (which includes its separator) at the start of a line of text:
 * 0, or -1 when no line starts so or no number follows. */
static int find_number(const char *text, const char *key, uint64_t *out)
{
    size_t klen = strlen(key);
    for (const char *line = text; line; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (strncmp(line, key, klen) != 0)
            continue;
        char *end = NULL;
        unsigned long long v = strtoull(line + klen, &end, 10);
        if (end == line + klen)
            return -1;
        *out = (uint64_t)v;
        return 0;
    }
    return -1;
}

static void meminfo_read(const char *root, ServerMemory *m)
{
    char buf[8192];
    uint64_t kib;
    if (read_text(root, "/proc/meminfo", buf, sizeof buf) && find_number(buf, "MemAvailable:", &kib) == 0)
        m->meminfo_available = kib * 1024;
}

/* A cgroup's limit and what it uses beyond its file cache (which the kernel reclaims
 * before it kills; tmpfs pages it cannot); 0 when it has no limit (or no readable one). */
static int cgroup_v2_limit(const char *root, const char *dir, uint64_t *limit, uint64_t *used)
{
    char buf[8192];
    char *end = NULL;
    if (!read_in(root, dir, "memory.max", buf, sizeof buf) || strncmp(buf, "max", 3) == 0)
        return 0;
    *limit = strtoull(buf, &end, 10);
    if (end == buf || *limit >= MEM_UNLIMITED)
        return 0;
    uint64_t current = 0, file = 0, shmem = 0;
    if (read_in(root, dir, "memory.current", buf, sizeof buf))
        current = strtoull(buf, NULL, 10);
    if (read_in(root, dir, "memory.stat", buf, sizeof buf)) {
        find_number(buf, "file ", &file);
        find_number(buf, "shmem ", &shmem);
    }
    uint64_t cache = file > shmem ? file - shmem : 0;
    *used = current > cache ? current - cache : 0;
    return 1;
}

static int cgroup_v1_limit(const char *root, const char *dir, uint64_t *limit, uint64_t *used)
{
    char buf[16384];
    uint64_t usage = 0, file = 0, shmem = 0;
    if (!read_in(root, dir, "memory.stat", buf, sizeof buf) ||
        find_number(buf, "hierarchical_memory_limit ", limit) != 0 || *limit >= MEM_UNLIMITED)
        return 0;
    find_number(buf, "total_cache ", &file);
    find_number(buf, "total_shmem ", &shmem);
    uint64_t cache = file > shmem ? file - shmem : 0;
    if (read_in(root, dir, "memory.usage_in_bytes", buf, sizeof buf))
        usage = strtoull(buf, NULL, 10);
    *used = usage > cache ? usage - cache : 0;
    return 1;
}

static int dir_exists(const char *root, const char *dir)
{
    char full[4096];
    struct stat st;
    snprintf(full, sizeof full, "%s%s", root, dir);
    return stat(full, &st) == 0 && S_ISDIR(st.st_mode);
}

/* What the kept cgroup limit leaves (cgroup_used <= cgroup_limit). */
static uint64_t cgroup_room(const ServerMemory *m) { return m->cgroup_limit - m->cgroup_used; }

/* Keeps the limit that leaves the least room. */
static void cgroup_consider(ServerMemory *m, uint64_t limit, uint64_t used)
{
    uint64_t room = limit > used ? limit - used : 0;
    if (m->cgroup_limit == 0 || room < cgroup_room(m)) {
        m->cgroup_limit = limit;
        m->cgroup_used = used < limit ? used : limit;
    }
}

/* v2: the process's own cgroup and every one above it up to the mount (a limit set on a
 * parent binds the children). In a container the path names the host's hierarchy while
 * the mount shows the container's own cgroup at its top: then only the top is read. */
static void cgroup_v2_read(const char *root, const char *cg_path, ServerMemory *m)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", strcmp(cg_path, "/") == 0 ? "" : cg_path);
    if (!dir_exists(root, dir))
        snprintf(dir, sizeof dir, "/sys/fs/cgroup");
    for (;;) {
        uint64_t limit, used;
        if (cgroup_v2_limit(root, dir, &limit, &used))
            cgroup_consider(m, limit, used);
        if (strcmp(dir, "/sys/fs/cgroup") == 0)
            break;
        *strrchr(dir, '/') = '\0';
    }
}

/* v1: memory.stat's hierarchical_memory_limit is already the tightest of the ancestors. */
static void cgroup_v1_read(const char *root, const char *cg_path, ServerMemory *m)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", strcmp(cg_path, "/") == 0 ? "" : cg_path);
    if (!dir_exists(root, dir))
        snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory");
    uint64_t limit, used;
    if (cgroup_v1_limit(root, dir, &limit, &used))
        cgroup_consider(m, limit, used);
}

/* /proc/self/cgroup lines are "ID:CONTROLLERS:PATH": v2's is "0::PATH", v1's memory
 * controller is one of a comma list. */
static void cgroup_read(const char *root, ServerMemory *m)
{
    char buf[8192];
    if (!read_text(root, "/proc/self/cgroup", buf, sizeof buf))
        return;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2 || c2[1] != '/' || strlen(c2 + 1) >= 2048)
            continue;
        *c2 = '\0';
        const char *controllers = c1 + 1, *path = c2 + 1;
        if (*controllers == '\0') {
            cgroup_v2_read(root, path, m);
            continue;
        }
        char list[256];
        snprintf(list, sizeof list, ",%s,", controllers);
        if (strstr(list, ",memory,"))
            cgroup_v1_read(root, path, m);
    }
}

void server_memory_read(const char *root, ServerMemory *m)
{
    memset(m, 0, sizeof *m);
    meminfo_read(root, m);
    cgroup_read(root, m);
    m->known = m->meminfo_available > 0 || m->cgroup_limit > 0;
    m->available = m->meminfo_available;
    if (m->cgroup_limit && (m->meminfo_available == 0 || cgroup_room(m) < m->available))
        m->available = cgroup_room(m);
}

/* "27.5 GiB", "512 MiB" */
static const char *size_text(uint64_t bytes, char *buf, size_t cap)
{
    if (bytes >= (UINT64_C(1) << 30))
        snprintf(buf, cap, "%.1f GiB", (double)bytes / (double)(UINT64_C(1) << 30));
    else
        snprintf(buf, cap, "%" PRIu64 " MiB", bytes >> 20);
    return buf;
}

size_t server_memory_need(const ModelPlan *plan, const EngineConfig *engine)
{
    size_t serving = plan->weight_bytes + engine_memory_bytes(&plan->config, engine);
    return (serving > plan->load_peak_bytes ? serving : plan->load_peak_bytes) + MEM_PROCESS_BASE;
}

/* The smaller weight types a quantised file widened to F32 may be held in instead, densest
 * last: what the hint names and what auto falls back to. */
static const ModelWeightType smaller_types[] = { MODEL_WEIGHTS_INT8, MODEL_WEIGHTS_Q4 };
static const char *const smaller_names[] = { "int8", "q4" };
#define N_SMALLER (int)(sizeof smaller_types / sizeof smaller_types[0])

/* "; --weight-type int8 holds these weights in X, --weight-type q4 in Y" for the types
 * not asked that are smaller (where the CPU runs them: model_plan refuses them else). */
static void smaller_types_hint(const ServerConfig *c, const ModelPlan *plan, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_SMALLER && used < cap; i++) {
        ModelPlan smaller;
        char err[256], size[32];
        if (c->weight_type == smaller_types[i] ||
            model_plan(c->model_path, smaller_types[i], &smaller, err, sizeof err) != 0 ||
            smaller.weight_bytes >= plan->weight_bytes)
            continue;
        used += (size_t)snprintf(buf + used, cap - used, used ? ", --weight-type %s in %s"
                                 : "; --weight-type %s holds these weights in %s", smaller_names[i],
                                 size_text(smaller.weight_bytes, size, sizeof size));
    }
}

/* Where m->available comes from, for the log. */
static const char *room_where(const ServerMemory *m, char *buf, size_t cap)
{
    char limit_s[32], used_s[32];
    if (m->cgroup_limit && m->available == cgroup_room(m))
        snprintf(buf, cap, "the cgroup's memory limit %s, %s of it in use",
                 size_text(m->cgroup_limit, limit_s, sizeof limit_s), size_text(m->cgroup_used, used_s, sizeof used_s));
    else
        snprintf(buf, cap, "MemAvailable");
    return buf;
}

int server_memory_check(const ServerConfig *c, const ModelPlan *plan, const ServerMemory *m,
                        char *msg, size_t msg_len)
{
    size_t need = server_memory_need(plan, &c->engine);
    char need_s[32], avail_s[32], w_s[32], kv_s[32], rest_s[32], where[128];
    size_text(need, need_s, sizeof need_s);
    size_text(m->available, avail_s, sizeof avail_s);
    room_where(m, where, sizeof where);
    if (!m->known || need <= m->available) {
        snprintf(msg, msg_len, "memory: %s needed, %s available (%s)", need_s,
                 m->known ? avail_s : "unknown", m->known ? where : "nothing readable");
        return 0;
    }
    const ModelConfig *mc = &plan->config;
    char hint[160];
    smaller_types_hint(c, plan, hint, sizeof hint);
    snprintf(msg, msg_len,
             "not enough memory: this model and KV cache need %s (weights %s: %s on disk, held "
             "as %s; KV cache %s; the rest %s) and %s is available (%s)%s; --kv-cache-mb sizes "
             "the cache; --no-memory-check starts anyway",
             need_s, size_text(plan->weight_bytes, w_s, sizeof w_s), ggml_type_name(mc->weight_type),
             model_matrix_type_name(mc), size_text(c->engine.kv_cache_bytes, kv_s, sizeof kv_s),
             size_text(need - plan->weight_bytes - c->engine.kv_cache_bytes, rest_s, sizeof rest_s),
             avail_s, where, hint);
    return -1;
}

ModelWeightType server_memory_auto_fit(const ServerConfig *c, const ModelPlan *plan,
                                       const ServerMemory *m, ModelPlan *smaller,
                                       char *msg, size_t msg_len)
{
    const ModelConfig *mc = &plan->config;
    if (c->weight_type != MODEL_WEIGHTS_AUTO || ggml_type_block_elems(mc->weight_type) <= 1 || !m->known)
        return MODEL_WEIGHTS_AUTO;
    for (int i = 0; i < N_SMALLER; i++) {
        char err[256], need_s[32], wide_s[32], avail_s[32], where[128];
        if (model_plan(c->model_path, smaller_types[i], smaller, err, sizeof err) != 0 ||
            smaller->weight_bytes >= plan->weight_bytes)
            continue;
        size_t need = server_memory_need(smaller, &c->engine);
        if (need > m->available)
            continue;
        snprintf(msg, msg_len,
                 "memory: --weight-type auto holds this %s file's matrices as %s, %s needed (as %s: "
                 "%s, more than the %s available: %s)",
                 ggml_type_name(mc->weight_type), smaller_names[i], size_text(need, need_s, sizeof need_s),
                 model_matrix_type_name(mc), size_text(server_memory_need(plan, &c->engine), wide_s, sizeof wide_s),
                 size_text(m->available, avail_s, sizeof avail_s), room_where(m, where, sizeof where));
        return smaller_types[i];
    }
    return MODEL_WEIGHTS_AUTO;
}
