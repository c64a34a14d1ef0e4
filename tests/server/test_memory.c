/* test_memory — the start-up memory check: what server_memory_read finds in /proc and
 * /sys laid out by the test (MemAvailable, cgroup v2 and v1 limits, in a container and
 * not), what server_memory_check says about a real model file against it, and the
 * binary refusing a KV cache no machine has, or one above its cgroup's limit. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/server.h"
#include "tests/server/server_test.h"

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

static const char *bin_path(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_bin_dir(), name);
    return path;
}

/* ---- a machine of the test's own: files under a temporary root ------------------------- */

static char root[64];

static int root_setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/pagedserve-mem-XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int root_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes text to root/path, making its folders. */
static void put(const char *path, const char *text)
{
    char full[512];
    snprintf(full, sizeof full, "%s%s", root, path);
    for (char *p = full + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(full, 0755);
        *p = '/';
    }
    FILE *f = fopen(full, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void put_meminfo(uint64_t available_kib)
{
    char text[256];
    snprintf(text, sizeof text, "MemTotal:       25000000 kB\nMemFree:        1000 kB\n"
             "MemAvailable:   %llu kB\nBuffers:        12 kB\n", (unsigned long long)available_kib);
    put("/proc/meminfo", text);
}

static void put_number(const char *path, uint64_t v)
{
    char text[32];
    snprintf(text, sizeof text, "%llu\n", (unsigned long long)v);
    put(path, text);
}

static ServerMemory read_root(void)
{
    ServerMemory m;
    server_memory_read(root, &m);
    return m;
}

/* ---- server_memory_read ---------------------------------------------------------------- */

static void test_meminfo_only(void **state)
{
    (void)state;
    put_meminfo(8 * 1024 * 1024);
    ServerMemory m = read_root();
    assert_int_equal(m.meminfo_available, 8 * GiB);
    assert_int_equal(m.cgroup_limit, 0);
    assert_int_equal(m.available, 8 * GiB);
}

static void test_nothing_readable(void **state)
{
    (void)state;
    ServerMemory m = read_root();
    assert_false(m.known);
    put("/proc/meminfo", "MemTotal: 1 kB\nMemAvailable: many kB\n");
    put("/proc/self/cgroup", "0::/a\n");
    put("/sys/fs/cgroup/a/memory.max", "max\n");
    m = read_root();
    assert_false(m.known);
    /* a cgroup at its limit leaves nothing, which is known */
    put_number("/sys/fs/cgroup/a/memory.max", 64 * MiB);
    put_number("/sys/fs/cgroup/a/memory.current", 80 * MiB);
    m = read_root();
    assert_true(m.known);
    assert_int_equal(m.available, 0);
}

/* v2: the process's cgroup and those above it; file cache (not tmpfs) does not count as used;
 * the limit leaving the least room wins, whichever level it is on. */
static void test_cgroup_v2(void **state)
{
    (void)state;
    put_meminfo(8 * 1024 * 1024);
    put("/proc/self/cgroup", "0::/svc/job\n");
    put("/sys/fs/cgroup/svc/job/memory.max", "max\n");
    put_number("/sys/fs/cgroup/svc/memory.max", 2 * GiB);
    put_number("/sys/fs/cgroup/svc/memory.current", 700 * MiB);
    /* file cache 250 MiB, 50 of them tmpfs (shmem): 200 MiB reclaimable */
    put("/sys/fs/cgroup/svc/memory.stat", "anon 400000\nfile 262144000\nfile_mapped 1\n"
        "active_file 1\nshmem 52428800\nslab 3\n");
    ServerMemory m = read_root();
    assert_int_equal(m.cgroup_limit, 2 * GiB);
    assert_int_equal(m.cgroup_used, 500 * MiB);
    assert_int_equal(m.available, 2 * GiB - 500 * MiB);
    /* a tighter limit on the job itself */
    put_number("/sys/fs/cgroup/svc/job/memory.max", 1 * GiB);
    put_number("/sys/fs/cgroup/svc/job/memory.current", 100 * MiB);
    m = read_root();
    assert_int_equal(m.cgroup_limit, 1 * GiB);
    assert_int_equal(m.available, 1 * GiB - 100 * MiB);
    /* the parent's limit binds again once it leaves less room than the job's */
    put_number("/sys/fs/cgroup/svc/memory.current", 1900 * MiB);
    m = read_root();
    assert_int_equal(m.cgroup_limit, 2 * GiB);
    assert_int_equal(m.available, 2 * GiB - 1700 * MiB);
    /* MemAvailable when it is the smaller */
    put_meminfo(100 * 1024);
    m = read_root();
    assert_int_equal(m.available, 100 * MiB);
}

/* In a container the path names the host's cgroup, which the container's mount does not
 * have: its top is the container's own cgroup (docker run --memory). */
static void test_cgroup_v2_container(void **state)
{
    (void)state;
    put_meminfo(20 * 1024 * 1024);
    put("/proc/self/cgroup", "0::/system.slice/docker-0123abcd.scope\n");
    put_number("/sys/fs/cgroup/memory.max", 512 * MiB);
    put_number("/sys/fs/cgroup/memory.current", 12 * MiB);
    ServerMemory m = read_root();
    assert_int_equal(m.cgroup_limit, 512 * MiB);
    assert_int_equal(m.available, 500 * MiB);
}

/* v1: the memory controller's line (one of a list), memory.stat's hierarchical limit less
 * usage_in_bytes and the file cache (total_cache less total_shmem); "unlimited" (about
 * 2^63) is no limit. */
static void test_cgroup_v1(void **state)
{
    (void)state;
    put_meminfo(20 * 1024 * 1024);
    put("/proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/grp\n0::/\n");
    put("/sys/fs/cgroup/memory/grp/memory.stat", "cache 1\nrss 2\nhierarchical_memory_limit "
        "1073741824\ntotal_cache 157286400\ntotal_shmem 52428800\n");
    put_number("/sys/fs/cgroup/memory/grp/memory.usage_in_bytes", 300 * MiB);
    ServerMemory m = read_root();
    assert_int_equal(m.cgroup_limit, 1 * GiB);
    assert_int_equal(m.cgroup_used, 200 * MiB);
    assert_int_equal(m.available, 824 * MiB);
    put("/sys/fs/cgroup/memory/grp/memory.stat", "hierarchical_memory_limit 9223372036854771712\n");
    m = read_root();
    assert_int_equal(m.cgroup_limit, 0);
    assert_int_equal(m.available, 20 * GiB);
}

/* ---- server_memory_check on a real file ------------------------------------------------ */

static ServerConfig config_for(const char *model, ModelWeightType type, size_t kv_mib)
{
    ServerConfig c = {0};
    c.model_path = (char *)model;
    c.weight_type = type;
    engine_config_default(&c.engine);
    c.engine.kv_cache_bytes = kv_mib * MiB;
    return c;
}

/* The need adds the planned weights, the larger of the load's copy and the engine's
 * memory, and a base; exactly the need fits, a byte less is refused with the numbers and
 * the ways out; nothing readable is not refused. */
static void test_check(void **state)
{
    (void)state;
    const char *model = test_random_model();
    assert_non_null(model);
    ServerConfig c = config_for(model, MODEL_WEIGHTS_AUTO, 64);
    ModelPlan plan;
    char msg[1024];
    assert_int_equal(model_plan(model, c.weight_type, &plan, msg, sizeof msg), 0);
    size_t need = server_memory_need(&plan, &c.engine);
    assert_true(need > plan.weight_bytes + c.engine.kv_cache_bytes);
    assert_true(need >= plan.weight_bytes + engine_memory_bytes(&plan.config, &c.engine));
    ServerMemory m = {.meminfo_available = need, .available = need, .known = true};
    assert_int_equal(server_memory_check(&c, &plan, &m, msg, sizeof msg), 0);
    assert_non_null(strstr(msg, "MemAvailable"));
    m.available = m.meminfo_available = need - 1;
    assert_int_equal(server_memory_check(&c, &plan, &m, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "not enough memory"));
    assert_non_null(strstr(msg, "KV cache 64 MiB"));
    assert_non_null(strstr(msg, "(MemAvailable)"));
    assert_non_null(strstr(msg, "--kv-cache-mb"));
    assert_non_null(strstr(msg, "--no-memory-check"));
    /* a cgroup's limit is named when it is what binds */
    m = (ServerMemory){.meminfo_available = 8 * GiB, .cgroup_limit = need, .cgroup_used = 2 * MiB,
                       .available = need - 2 * MiB, .known = true};
    assert_int_equal(server_memory_check(&c, &plan, &m, msg, sizeof msg), -1);
    assert_non_null(strstr(msg, "cgroup's memory limit"));
    m.available = 0; /* a full cgroup */
    assert_int_equal(server_memory_check(&c, &plan, &m, msg, sizeof msg), -1);
    m = (ServerMemory){0};
    assert_int_equal(server_memory_check(&c, &plan, &m, msg, sizeof msg), 0);
    assert_non_null(strstr(msg, "unknown"));
}

/* Writes a q8_0 model of mkmodel's flags to path (a file of the test's own). */
static void make_q8_model(const char *path, const char *const *flags)
{
    const char *mk[24];
    int n = 0;
    mk[n++] = bin_path("mkmodel");
    for (int i = 0; flags[i] && n < 18; i++)
        mk[n++] = flags[i];
    const char *tail[] = {"--type", "q8_0", "-o", path, NULL};
    for (int i = 0; tail[i]; i++)
        mk[n++] = tail[i];
    mk[n] = NULL;
    assert_int_equal(proc_run(mk, NULL, NULL, 60.0), 0);
}

/* A file widened to F32 is told what int8 would hold, and q4 where the CPU runs it;
 * asked for int8 already, only q4. */
static void test_check_int8_hint(void **state)
{
    (void)state;
    char model[64], msg[1024];
    snprintf(model, sizeof model, "/tmp/pagedserve-mem-q8-%d.gguf", (int)getpid());
    make_q8_model(model, (const char *const[]){"--demo", NULL});
    ServerConfig c = config_for(model, MODEL_WEIGHTS_AUTO, 16);
    ServerMemory m = {.meminfo_available = 1, .available = 1, .known = true};
    ModelPlan plan, int8, q4;
    char as_int8[1024] = "";
    int planned = model_plan(model, MODEL_WEIGHTS_AUTO, &plan, msg, sizeof msg) == 0 &&
                  model_plan(model, MODEL_WEIGHTS_INT8, &int8, msg, sizeof msg) == 0;
    int q4_runs = model_plan(model, MODEL_WEIGHTS_Q4, &q4, msg, sizeof msg) == 0;
    int refused = planned && server_memory_check(&c, &plan, &m, msg, sizeof msg) == -1;
    c.weight_type = MODEL_WEIGHTS_INT8;
    int refused_int8 = planned && server_memory_check(&c, &int8, &m, as_int8, sizeof as_int8) == -1;
    unlink(model); /* the hint reads the file; gone before any assertion can leave it */
    assert_true(planned && refused && refused_int8);
    assert_true(int8.weight_bytes < plan.weight_bytes);
    assert_non_null(strstr(msg, "q8_0 on disk, held as f32"));
    assert_non_null(strstr(msg, "--weight-type int8 holds these weights in"));
    assert_null(strstr(as_int8, "--weight-type int8"));
    if (q4_runs) {
        assert_true(q4.weight_bytes < int8.weight_bytes);
        assert_non_null(strstr(msg, ", --weight-type q4 in "));
        assert_non_null(strstr(as_int8, "; --weight-type q4 holds these weights in"));
    } else {
        assert_null(strstr(msg, "q4"));
    }
}

/* Under auto, a quantised file widened past the room is held in the first smaller type
 * that fits: int8 with room for exactly int8's need, q4 (where the CPU runs it) with a
 * byte less, nothing with less than q4's; never for a type asked for, an F32 file, or
 * memory nothing said about. */
static void test_auto_fit(void **state)
{
    (void)state;
    char model[64], msg[1024];
    snprintf(model, sizeof model, "/tmp/pagedserve-mem-fit-%d.gguf", (int)getpid());
    make_q8_model(model, (const char *const[]){"--demo", NULL});
    ServerConfig c = config_for(model, MODEL_WEIGHTS_AUTO, 16);
    ModelPlan plan, int8, q4, got;
    int planned = model_plan(model, MODEL_WEIGHTS_AUTO, &plan, msg, sizeof msg) == 0 &&
                  model_plan(model, MODEL_WEIGHTS_INT8, &int8, msg, sizeof msg) == 0;
    int q4_runs = model_plan(model, MODEL_WEIGHTS_Q4, &q4, msg, sizeof msg) == 0;
    size_t need_int8 = planned ? server_memory_need(&int8, &c.engine) : 0;
    ServerMemory m = {.meminfo_available = need_int8, .available = need_int8, .known = true};
    ModelWeightType fit = planned ? server_memory_auto_fit(&c, &plan, &m, &got, msg, sizeof msg) : MODEL_WEIGHTS_AUTO;
    char said[1024];
    snprintf(said, sizeof said, "%s", msg);
    m.available = m.meminfo_available = need_int8 - 1;
    ModelWeightType fit_less = planned ? server_memory_auto_fit(&c, &plan, &m, &got, msg, sizeof msg) : MODEL_WEIGHTS_AUTO;
    size_t got_bytes = got.weight_bytes;
    size_t need_q4 = q4_runs ? server_memory_need(&q4, &c.engine) : 0;
    m.available = m.meminfo_available = q4_runs ? need_q4 - 1 : need_int8 - 1;
    snprintf(msg, sizeof msg, "untouched");
    ModelWeightType fit_none = planned ? server_memory_auto_fit(&c, &plan, &m, &got, msg, sizeof msg) : MODEL_WEIGHTS_AUTO;
    int none_said_nothing = strcmp(msg, "untouched") == 0;
    m.available = m.meminfo_available = need_int8;
    c.weight_type = MODEL_WEIGHTS_F32; /* asked: refused as it is, not changed */
    ModelWeightType fit_asked = server_memory_auto_fit(&c, &plan, &m, &got, msg, sizeof msg);
    c.weight_type = MODEL_WEIGHTS_AUTO;
    m.known = false;
    ModelWeightType fit_unknown = server_memory_auto_fit(&c, &plan, &m, &got, msg, sizeof msg);
    unlink(model);
    assert_true(planned);
    assert_true(server_memory_need(&plan, &c.engine) > need_int8);
    assert_int_equal(fit, MODEL_WEIGHTS_INT8);
    assert_non_null(strstr(said, "auto holds this q8_0 file's matrices as int8"));
    assert_non_null(strstr(said, "(as f32: "));
    assert_non_null(strstr(said, "available: MemAvailable)"));
    if (q4_runs) {
        assert_true(need_q4 < need_int8);
        assert_int_equal(fit_less, MODEL_WEIGHTS_Q4);
        assert_int_equal(got_bytes, q4.weight_bytes);
    } else {
        assert_int_equal(fit_less, MODEL_WEIGHTS_AUTO);
    }
    assert_int_equal(fit_none, MODEL_WEIGHTS_AUTO);
    assert_true(none_said_nothing); /* the caller logs the check's refusal from msg */
    assert_int_equal(fit_asked, MODEL_WEIGHTS_AUTO);
    assert_int_equal(fit_unknown, MODEL_WEIGHTS_AUTO);
    /* an F32 file is not re-quantised unasked */
    const char *f32 = test_random_model();
    assert_non_null(f32);
    c = config_for(f32, MODEL_WEIGHTS_AUTO, 16);
    assert_int_equal(model_plan(f32, MODEL_WEIGHTS_AUTO, &plan, msg, sizeof msg), 0);
    assert_int_equal(model_plan(f32, MODEL_WEIGHTS_INT8, &int8, msg, sizeof msg), 0);
    need_int8 = server_memory_need(&int8, &c.engine);
    m = (ServerMemory){.meminfo_available = need_int8, .available = need_int8, .known = true};
    assert_true(server_memory_need(&plan, &c.engine) > need_int8);
    assert_int_equal(server_memory_auto_fit(&c, &plan, &m, &got, msg, sizeof msg), MODEL_WEIGHTS_AUTO);
}

/* ---- the binary ------------------------------------------------------------------------ */

/* A KV cache of 1 TiB: refused before anything is allocated, exit 1, the event logged. */
static void test_refuses_what_no_machine_has(void **state)
{
    (void)state;
    ServerMemory here;
    server_memory_read("", &here);
    if (!here.known)
        skip(); /* no /proc/meminfo: the check passes, and the cache would be allocated */
    const char *argv[] = {bin_path("pagedserve"), "-m", test_random_model(), "--port", "0",
                          "--kv-cache-mb", "1048576", NULL};
    char *err = NULL;
    assert_int_equal(proc_run(argv, NULL, &err, 30.0), 1);
    assert_non_null(strstr(err, "\"event\":\"memory\""));
    assert_non_null(strstr(err, "not enough memory"));
    assert_non_null(strstr(err, "KV cache 1024.0 GiB"));
    assert_null(strstr(err, "\"event\":\"startup\""));
    free(err);
}

/* ---- a real cgroup: the kernel's own files --------------------------------------------- */

/* Removes the cgroups of earlier runs whose test process is gone (killed by ctest's
 * timeout before its rmdir; their server children die with it). A cgroup still holding a
 * process is not empty, and rmdir leaves it. */
static void cgroup_sweep(const char *parent)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid;
        char tail;
        if (sscanf(e->d_name, "pagedserve-test-%d%c", &pid, &tail) != 1)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        rmdir(path);
    }
    closedir(d);
}

/* A memory cgroup of its own with a limit of limit_mib (v2 under the root, or v1's memory
 * hierarchy), or 0 when this machine does not let the test make one (not root, no memory
 * controller): then the cgroup test says it was skipped. */
static int cgroup_make(char *dir, size_t cap, unsigned limit_mib)
{
    struct stat st;
    int v2 = stat("/sys/fs/cgroup/cgroup.controllers", &st) == 0;
    const char *parent = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    cgroup_sweep(parent);
    snprintf(dir, cap, "%s/pagedserve-test-%d", parent, (int)getpid());
    if (mkdir(dir, 0755) != 0)
        return 0;
    char file[600];
    snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    FILE *f = fopen(file, "w");
    int ok = f && fprintf(f, "%llu\n", (unsigned long long)(limit_mib * MiB)) > 0;
    if (f)
        ok = (fclose(f) == 0) && ok;
    if (!ok)
        rmdir(dir);
    return ok;
}

/* In a cgroup limited to 256 MiB (as `docker run --memory 256m` makes), a 512 MiB KV
 * cache is refused by name of the limit, where it used to be killed by the kernel
 * without a word; with --no-memory-check the server is let through (and the kernel then
 * kills it when the cache is touched, or it fails to allocate: never a clean start; a
 * machine with swap may start it, and then proc_run's bound kills it). */
static void test_real_cgroup_limit(void **state)
{
    (void)state;
    char dir[512];
    if (!cgroup_make(dir, sizeof dir, 256)) {
        print_message("SKIPPED real cgroup limit: cannot create a memory cgroup here "
                      "(needs root and a writable memory controller)\n");
        skip();
    }
    char script[1536];
    snprintf(script, sizeof script, "echo $$ > %s/cgroup.procs && exec \"$0\" \"$@\"", dir);
    const char *argv[] = {"/bin/sh", "-c", script, bin_path("pagedserve"), "-m", test_random_model(),
                          "--port", "0", "--threads", "1", "--kv-cache-mb", "512",
                          "--max-prefill-chunk", "64", NULL, NULL};
    char *err = NULL, *err_let = NULL;
    int rc = proc_run(argv, NULL, &err, 60.0);
    argv[14] = "--no-memory-check";
    int rc_let = proc_run(argv, NULL, &err_let, 60.0);
    int removed = rmdir(dir); /* before any assertion can leave it behind */
    print_message("in the cgroup: exit %d; with --no-memory-check: exit %d\n", rc, rc_let);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, "not enough memory"));
    assert_non_null(strstr(err, "the cgroup's memory limit 256 MiB"));
    assert_non_null(strstr(err_let, "--no-memory-check: loading"));
    assert_true(rc_let == 137 || rc_let == 1); /* killed as the cache is touched, or no memory */
    assert_int_equal(removed, 0);
    free(err);
    free(err_let);
}

static ServerProc fit_srv;

/* In a cgroup limited to 512 MiB, a 134M-parameter Q8_0 file under auto (as F32, 682 MiB
 * with its engine; as int8, 369) starts, held as int8 with the warning saying why, and
 * answers; with --no-memory-check auto stays F32 (and the kernel kills it, or its
 * allocation fails, as test_real_cgroup_limit's). The server joins the cgroup itself,
 * before exec. */
static void test_real_cgroup_auto_fit(void **state)
{
    (void)state;
    char dir[512], procs[600], model[64], body[160];
    snprintf(model, sizeof model, "/tmp/pagedserve-mem-q8-134m-%d.gguf", (int)getpid());
    make_q8_model(model, (const char *const[]){"--dim", "768", "--layers", "12", "--heads", "12",
                                                "--ffn", "2048", NULL});
    if (!cgroup_make(dir, sizeof dir, 512)) {
        unlink(model);
        print_message("SKIPPED auto's smaller weights in a real cgroup: cannot create a memory "
                      "cgroup here (needs root and a writable memory controller)\n");
        skip();
    }
    snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
    snprintf(body, sizeof body, "{\"model\":\"pagedserve-mem-q8-134m-%d\",\"prompt\":\"hello\","
             "\"max_tokens\":4}", (int)getpid());
    const char *args[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", NULL};
    int started = server_proc_start_in(&fit_srv, args, procs, 60.0) == 0;
    char *log = started ? server_proc_log(&fit_srv) : NULL;
    int status = 0;
    json_t *r = started ? post_json(fit_srv.port, "/v1/completions", body, &status) : NULL;
    int stopped = started ? server_proc_stop(&fit_srv, 30.0) : -1;
    char script[1536], *err_let = NULL;
    snprintf(script, sizeof script, "echo $$ > %s && exec \"$0\" \"$@\"", procs);
    const char *let[] = {"/bin/sh", "-c", script, bin_path("pagedserve"), "-m", model, "--port", "0",
                         "--threads", "1", "--kv-cache-mb", "16", "--no-memory-check", NULL};
    int rc_let = proc_run(let, NULL, &err_let, 60.0);
    int removed = rmdir(dir);
    unlink(model);
    print_message("with --no-memory-check: exit %d\n", rc_let);
    assert_true(started);
    assert_non_null(strstr(log, "auto holds this q8_0 file's matrices as int8"));
    assert_non_null(strstr(log, "the cgroup's memory limit 512 MiB"));
    assert_non_null(strstr(log, "\"weight_matrices\":\"int8\""));
    assert_int_equal(status, 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r, "usage"), "completion_tokens")), 4);
    assert_int_equal(stopped, 0);
    assert_int_equal(removed, 0);
    /* asked to start anyway, auto holds what it would with room: F32 (too much here) */
    assert_non_null(strstr(err_let, "--no-memory-check: loading"));
    assert_null(strstr(err_let, "auto holds"));
    assert_true(rc_let == 137 || rc_let == 1);
    json_decref(r);
    free(log);
    free(err_let);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_meminfo_only, root_setup, root_teardown),
        cmocka_unit_test_setup_teardown(test_nothing_readable, root_setup, root_teardown),
        cmocka_unit_test_setup_teardown(test_cgroup_v2, root_setup, root_teardown),
        cmocka_unit_test_setup_teardown(test_cgroup_v2_container, root_setup, root_teardown),
        cmocka_unit_test_setup_teardown(test_cgroup_v1, root_setup, root_teardown),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_check_int8_hint),
        cmocka_unit_test(test_auto_fit),
        cmocka_unit_test(test_refuses_what_no_machine_has),
        cmocka_unit_test(test_real_cgroup_limit),
        cmocka_unit_test(test_real_cgroup_auto_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
