/* duet-bench-agents, after the load: worker state (leaks, quarantine), the
 * reference outputs (duet-generate on the exact prompt ids, cached by a hash of
 * what determines them), statistics, and the reports (terminal table, JSON,
 * gnuplot PNG).  docs/BENCH.md. */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_agents.h"
#include "hash.h"
#include "time_util.h"

/* ---------------------------------------------------------------- processes and HTTP */

void ba_buf_add(ba_buf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            fprintf(stderr, "duet-bench-agents: out of memory\n");
            exit(1);
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static size_t get_write(char *p, size_t size, size_t n, void *ud)
{
    ba_buf_add(ud, p, size * n);
    return size * n;
}

char *ba_http_get(const char *url, long timeout_ms, long *status)
{
    *status = 0;
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    ba_buf_t b = {0};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, get_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    CURLcode cc = curl_easy_perform(h);
    if (cc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    if (cc != CURLE_OK) {
        free(b.s);
        return NULL;
    }
    return b.s ? b.s : strdup("");
}

/* Wait for pid until the deadline (monotonic seconds); kill its process group past it. */
static int wait_child(pid_t pid, double deadline)
{
    int st = 0;
    for (long i = 0;; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (r < 0)
            return -1;
        if (duet_time_s() > deadline) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(i < 100 ? 2000 : 20000);
    }
}

int ba_run_shell(const char *cmd, double deadline_s)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return wait_child(pid, duet_time_s() + deadline_s);
}

/* Run argv, its stdout captured (bounded by the deadline); returns the exit status or -1. */
static int run_capture(char *const argv[], double deadline_s, ba_buf_t *out)
{
    int fd[2];
    if (pipe(fd) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fd[1], 1);
        int dn = open("/dev/null", O_WRONLY);
        if (dn >= 0)
            dup2(dn, 2);
        close(fd[0]);
        close(fd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd[1]);
    double deadline = duet_time_s() + deadline_s;
    char b[4096];
    for (;;) {
        double left = deadline - duet_time_s();
        if (left <= 0)
            break;
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r <= 0)
            break;
        ssize_t n = read(fd[0], b, sizeof b);
        if (n <= 0)
            break;
        ba_buf_add(out, b, (size_t)n);
    }
    close(fd[0]);
    return wait_child(pid, deadline);
}

/* ---------------------------------------------------------------- worker state */

/* The requests the router holds bound to workers (its own table, not the workers'). */
static long router_held(const ba_opts_t *o)
{
    char url[512];
    long st = 0, n = -1;
    snprintf(url, sizeof url, "%s/v1/workers", o->url);
    char *body = ba_http_get(url, 5000, &st);
    json_t *j = st == 200 && body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    if (j) {
        n = 0;
        size_t i;
        json_t *x;
        json_array_foreach(json_object_get(j, "data"), i, x) n += (long)json_integer_value(json_object_get(x, "router_requests"));
    }
    json_decref(j);
    return n;
}

static void read_once(ba_run_t *run, ba_workers_t *ws)
{
    ba_opts_t *o = run->o;
    ws->n = 0;
    ws->err[0] = 0;
    ws->router_requests = router_held(o);
    if (o->n_workers) {
        ws->source = "duet-driver state";
        for (int i = 0; i < o->n_workers; i++) {
            ba_worker_state_t *w = &ws->w[ws->n++];
            memset(w, 0, sizeof *w);
            snprintf(w->name, sizeof w->name, "%s", o->workers[i]);
            char *argv[] = {(char *)o->driver, "state", (char *)o->workers[i], "--requests", NULL};
            ba_buf_t out = {0};
            int rc = run_capture(argv, 15.0, &out);
            json_t *j = rc == 0 && out.s ? json_loads(out.s, 0, NULL) : NULL;
            free(out.s);
            if (!j) {
                snprintf(ws->err, sizeof ws->err, "%s: duet-driver state failed (exit %d)", o->workers[i], rc);
                continue;
            }
            const char *id = json_string_value(json_object_get(j, "sender"));
            if (id)
                snprintf(w->name, sizeof w->name, "%s (%s)", id, o->workers[i]);
            w->pages_used = (long)json_integer_value(json_object_get(j, "pages_used"));
            w->pages_quarantined = (long)json_integer_value(json_object_get(j, "pages_quarantined"));
            w->slots_used = (long)json_integer_value(json_object_get(j, "slots_used"));
            w->slots_quarantined = (long)json_integer_value(json_object_get(j, "slots_quarantined"));
            w->requests = (long)json_array_size(json_object_get(j, "requests"));
            w->ok = 1;
            json_decref(j);
        }
        return;
    }
    ws->source = "router /v1/workers";
    char url[512];
    long st = 0;
    snprintf(url, sizeof url, "%s/v1/workers", o->url);
    char *body = ba_http_get(url, 5000, &st);
    json_t *j = st == 200 && body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    if (!j) {
        snprintf(ws->err, sizeof ws->err, "GET /v1/workers failed (status %ld)", st);
        return;
    }
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(j, "data"), i, x)
    {
        const char *role = json_string_value(json_object_get(x, "role"));
        if (!role || strcmp(role, "decode") || ws->n == BA_MAX_WORKERS)
            continue;
        ba_worker_state_t *w = &ws->w[ws->n++];
        memset(w, 0, sizeof *w);
        const char *id = json_string_value(json_object_get(x, "id"));
        snprintf(w->name, sizeof w->name, "%s%s", id ? id : "?",
                 json_is_true(json_object_get(x, "healthy")) ? "" : " (unhealthy)");
        w->pages_used = (long)json_integer_value(json_object_get(x, "pages_used"));
        w->pages_quarantined = (long)json_integer_value(json_object_get(x, "pages_quarantined"));
        w->slots_used = -1; /* heartbeats carry free slots only */
        w->slots_quarantined = -1;
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(x, "requests_per_state"), k, v) w->requests += (long)json_integer_value(v);
        w->ok = 1;
    }
    json_decref(j);
    if (!ws->n)
        snprintf(ws->err, sizeof ws->err, "the router lists no decode worker");
}

static int idle(const ba_workers_t *ws)
{
    if (!ws->n || ws->err[0] || ws->router_requests != 0)
        return 0;
    for (int i = 0; i < ws->n; i++) {
        const ba_worker_state_t *w = &ws->w[i];
        if (!w->ok || w->pages_used || w->pages_quarantined || w->slots_used > 0 || w->slots_quarantined > 0 ||
            w->requests)
            return 0;
    }
    return 1;
}

void ba_read_workers(ba_run_t *run)
{
    ba_workers_t *ws = &run->workers;
    double t0 = duet_time_s(), end = t0 + run->o->settle_s;
    /* the router's view comes from heartbeats (about 1 s old): two idle readings in a row */
    int need = run->o->n_workers ? 1 : 2, seen = 0;
    for (long i = 0;; i++) {
        read_once(run, ws);
        seen = idle(ws) ? seen + 1 : 0;
        if (seen >= need) {
            ws->settled = 1;
            break;
        }
        if (duet_time_s() >= end || g_stop) /* interrupted: one reading, as it is */
            break;
        usleep(run->o->n_workers ? 250000 : 600000);
    }
    ws->settle_s = duet_time_s() - t0;
}

/* ---------------------------------------------------------------- references */

typedef struct {
    ba_req_t *q;
    char path[PATH_MAX];    /* the cached ids */
} ref_job_t;

static uint64_t model_fingerprint(const char *dir)
{
    char real[PATH_MAX];
    if (!realpath(dir, real))
        snprintf(real, sizeof real, "%s", dir);
    duet_hasher_t *h = duet_hasher_create(0x6d6f64656cull);
    duet_hasher_str(h, real);
    DIR *d = opendir(dir);
    if (d) {
        /* names in directory order differ between machines; xor per-file hashes instead */
        uint64_t acc = 0;
        struct dirent *e;
        for (int guard = 0; guard < 100000 && (e = readdir(d)); guard++) {
            size_t n = strlen(e->d_name);
            if (!(n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) && strcmp(e->d_name, "config.json"))
                continue;
            char p[PATH_MAX];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (stat(p, &st) != 0)
                continue;
            char line[PATH_MAX + 64];
            snprintf(line, sizeof line, "%s %lld %lld.%09ld", e->d_name, (long long)st.st_size,
                     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
            acc ^= duet_hash64(line, strlen(line), 1);
        }
        closedir(d);
        duet_hasher_u64(h, acc);
    }
    uint64_t v = duet_hasher_digest(h);
    duet_hasher_destroy(&h);
    return v;
}

static uint64_t ref_key(const ba_opts_t *o, uint64_t model_fp, const ba_req_t *q)
{
    duet_hasher_t *h = duet_hasher_create(0x7265667631ull);
    duet_hasher_update(h, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    char p[160];
    snprintf(p, sizeof p, "t=%.6g seed=%llu max=%d kv=%s ik=%s eos=1", o->temperature,
             (unsigned long long)(o->temperature > 0 ? q->seed : 0), o->max_tokens, o->kv_dtype, o->index_k_dtype);
    duet_hasher_str(h, p);
    if (strcmp(o->ref_device, "cpu") != 0) { /* GPU references are their own (CPU keys stay as they were) */
        snprintf(p, sizeof p, "device=%s", o->ref_device);
        duet_hasher_str(h, p);
        if (o->ref_tp > 1) {
            snprintf(p, sizeof p, "tp=%d", o->ref_tp);
            duet_hasher_str(h, p);
        }
    }
    duet_hasher_u64(h, model_fp);
    uint64_t v = duet_hasher_digest(h);
    duet_hasher_destroy(&h);
    return v;
}

static int mkdirs(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int load_ids(const char *path, int32_t **out, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int cap = 64, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    long v;
    for (int guard = 0; ids && guard < (1 << 24) && fscanf(f, "%ld", &v) == 1; guard++) {
        if (n == cap) {
            cap *= 2;
            int32_t *p = realloc(ids, sizeof(int32_t) * (size_t)cap);
            if (!p)
                break;
            ids = p;
        }
        ids[n++] = (int32_t)v;
    }
    int ok = !ferror(f);
    fclose(f);
    if (!ids || !ok || n == 0) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

typedef struct {
    pid_t pid;
    ref_job_t *job;
    char out[PATH_MAX], prompt[PATH_MAX], errf[PATH_MAX];
    double deadline;
} running_t;

static pid_t spawn_ref(const ba_opts_t *o, const ba_req_t *q, running_t *r)
{
    FILE *f = fopen(r->prompt, "w");
    if (!f)
        return -1;
    for (int i = 0; i < q->n_prompt; i++)
        fprintf(f, i ? " %d" : "%d", q->prompt[i]);
    fputc('\n', f);
    if (fclose(f) != 0)
        return -1;
    char maxt[32], temp[32], seed[32];
    snprintf(maxt, sizeof maxt, "%d", o->max_tokens);
    snprintf(temp, sizeof temp, "%.6g", o->temperature);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)q->seed);
    char *argv[24];
    int n = 0;
    argv[n++] = (char *)o->generate;
    argv[n++] = "--model";
    argv[n++] = (char *)o->model;
    argv[n++] = "--prompt-file";
    argv[n++] = r->prompt;
    argv[n++] = "--max-tokens";
    argv[n++] = maxt;
    argv[n++] = "--kv-dtype";
    argv[n++] = (char *)o->kv_dtype;
    argv[n++] = "--index-k-dtype";
    argv[n++] = (char *)o->index_k_dtype;
    argv[n++] = "--stop-at-eos";
    if (strcmp(o->ref_device, "cpu") != 0) {
        argv[n++] = "--device";
        argv[n++] = (char *)o->ref_device;
    }
    char tpv[16];
    if (o->ref_tp > 1) {
        snprintf(tpv, sizeof tpv, "%d", o->ref_tp);
        argv[n++] = "--tp";
        argv[n++] = tpv;
    }
    if (o->temperature > 0) {
        argv[n++] = "--temperature";
        argv[n++] = temp;
        argv[n++] = "--seed";
        argv[n++] = seed;
    }
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setpgid(0, 0);
        if (setpriority(PRIO_PROCESS, 0, 10) != 0) { /* the references yield to anything else */
        }
        int fo = open(r->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(r->errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

duet_status_t ba_check_references(ba_run_t *run, duet_err_t *err)
{
    ba_opts_t *o = run->o;
    double t0 = duet_time_s();
    if (access(o->generate, X_OK) != 0)
        return duet_err_set(err, DUET_ERR_NOT_FOUND, "%s is not executable: build duet-generate or give --generate",
                            o->generate);
    if (mkdirs(o->cache_dir) != 0)
        return duet_err_set(err, DUET_ERR_IO, "cannot create the reference cache %s: %s", o->cache_dir,
                            strerror(errno));
    uint64_t mfp = model_fingerprint(o->model);
    ref_job_t *jobs = calloc(run->n_reqs ? run->n_reqs : 1, sizeof *jobs);
    running_t *rn = calloc((size_t)o->jobs, sizeof *rn);
    if (!jobs || !rn) {
        free(jobs);
        free(rn);
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory for %zu reference jobs", run->n_reqs);
    }
    size_t n_jobs = 0, todo = 0;
    for (size_t i = 0; i < run->n_reqs; i++) {
        ba_req_t *q = run->reqs[i];
        if (q->outcome != BA_OK)
            continue;
        if (q->n_prompt == 0) { /* the router returned no prompt ids: cannot be checked */
            q->ref_state = 3;
            continue;
        }
        ref_job_t *j = &jobs[n_jobs++];
        j->q = q;
        snprintf(j->path, sizeof j->path, "%s/%016llx.ids", o->cache_dir,
                 (unsigned long long)ref_key(o, mfp, q));
        if (access(j->path, R_OK) == 0)
            run->ref_cached++;
        else
            todo++;
    }
    fprintf(stderr, "duet-bench-agents: references: %zu requests, %zu cached, %zu to run on %d processes\n", n_jobs,
            n_jobs - todo, todo, o->jobs);
    /* run what is missing, o->jobs at a time; each reference process has a deadline */
    size_t next = 0, done = 0;
    int active = 0;
    double last_note = duet_time_s();
    for (long iter = 0; next < n_jobs || active; iter++) {
        if (g_stop && next < n_jobs) { /* interrupted: run no more, end those running, report what there is */
            fprintf(stderr, "duet-bench-agents: interrupted: %zu references not run\n", n_jobs - next);
            for (; next < n_jobs; next++)
                if (access(jobs[next].path, R_OK) != 0)
                    jobs[next].q->ref_state = 3;
            for (int k = 0; k < o->jobs; k++)
                if (rn[k].pid) {
                    kill(-rn[k].pid, SIGKILL);
                    kill(rn[k].pid, SIGKILL);
                    rn[k].deadline = 0;
                }
        }
        while (active < o->jobs && next < n_jobs) {
            ref_job_t *j = &jobs[next++];
            if (access(j->path, R_OK) == 0)
                continue;
            running_t *r = NULL;
            for (int k = 0; k < o->jobs; k++)
                if (!rn[k].pid) {
                    r = &rn[k];
                    break;
                }
            r->job = j;
            snprintf(r->out, sizeof r->out, "%s.tmp.%d", j->path, (int)getpid());
            snprintf(r->prompt, sizeof r->prompt, "%s.prompt.%d", j->path, (int)getpid());
            snprintf(r->errf, sizeof r->errf, "%s.err", j->path);
            r->deadline = duet_time_s() + 600.0 + (double)j->q->n_prompt * 0.05;
            r->pid = spawn_ref(o, j->q, r);
            if (r->pid <= 0) {
                r->pid = 0;
                j->q->ref_state = 3;
                continue;
            }
            active++;
        }
        for (int k = 0; k < o->jobs; k++) {
            running_t *r = &rn[k];
            if (!r->pid)
                continue;
            int st = 0;
            pid_t w = waitpid(r->pid, &st, WNOHANG);
            if (w == 0 && duet_time_s() > r->deadline) {
                kill(-r->pid, SIGKILL);
                kill(r->pid, SIGKILL);
                waitpid(r->pid, &st, 0);
                st = -1;
                w = r->pid;
            }
            if (w != r->pid)
                continue;
            int ok = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (ok && rename(r->out, r->job->path) == 0) {
                unlink(r->errf);
                run->ref_run++;
            } else {
                unlink(r->out);
                r->job->q->ref_state = 3;
                fprintf(stderr, "duet-bench-agents: duet-generate failed for session %d turn %d (log: %s)\n",
                        r->job->q->session, r->job->q->turn, r->errf);
            }
            unlink(r->prompt);
            r->pid = 0;
            active--;
            done++;
        }
        if (duet_time_s() - last_note > 10.0) {
            last_note = duet_time_s();
            fprintf(stderr, "duet-bench-agents: references: %zu of %zu run (%.0f s)\n", done, todo,
                    duet_time_s() - t0);
        }
        if (active)
            usleep(5000);
    }
    /* compare */
    int corrupt_left = o->test_corrupt_reference;
    for (size_t i = 0; i < n_jobs; i++) {
        ba_req_t *q = jobs[i].q;
        if (q->ref_state == 3)
            continue;
        if (load_ids(jobs[i].path, &q->ref, &q->n_ref) != 0) {
            q->ref_state = 3;
            continue;
        }
        if (corrupt_left > 0) { /* the detector's own test: a reference that cannot match */
            corrupt_left--;
            q->ref[q->n_ref - 1] = q->ref[q->n_ref - 1] == 2 ? 3 : 2;
        }
        int n = q->n_out < q->n_ref ? q->n_out : q->n_ref;
        int d = 0;
        while (d < n && q->out[d] == q->ref[d])
            d++;
        q->first_diff = d;
        q->ref_state = (d == n && q->n_out == q->n_ref) ? 1 : 2;
    }
    for (size_t i = 0; i < run->n_reqs; i++) {
        ba_req_t *q = run->reqs[i];
        if (q->outcome != BA_OK)
            continue;
        if (q->ref_state == 1 || q->ref_state == 2)
            run->compared++;
        run->equal += q->ref_state == 1;
        run->corrupted += q->ref_state == 2;
        run->ref_failed += q->ref_state == 3;
    }
    run->ref_s = duet_time_s() - t0;
    free(jobs);
    free(rn);
    return DUET_OK;
}

/* ---------------------------------------------------------------- statistics and reports */

typedef struct {
    double *v;
    size_t n, cap;
} vec_t;

static void vpush(vec_t *a, double x)
{
    if (a->n == a->cap) {
        size_t c = a->cap ? a->cap * 2 : 256;
        double *p = realloc(a->v, sizeof(double) * c);
        if (!p)
            return;
        a->v = p;
        a->cap = c;
    }
    a->v[a->n++] = x;
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    size_t n;
    double p50, p90, p99, max, mean;
} pct_t;

static pct_t pct(vec_t *a)
{
    pct_t p = {0};
    p.n = a->n;
    if (!a->n)
        return p;
    qsort(a->v, a->n, sizeof(double), dcmp);
    double sum = 0;
    for (size_t i = 0; i < a->n; i++)
        sum += a->v[i];
#define RANK(q) a->v[(size_t)((q) * (double)(a->n - 1) + 0.5)]
    p.p50 = RANK(0.50);
    p.p90 = RANK(0.90);
    p.p99 = RANK(0.99);
#undef RANK
    p.max = a->v[a->n - 1];
    p.mean = sum / (double)a->n;
    return p;
}

static json_t *pct_json(const pct_t *p)
{
    if (!p->n)
        return json_pack("{s:i}", "n", 0);
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "n", (json_int_t)p->n, "p50", p->p50, "p90", p->p90, "p99",
                     p->p99, "max", p->max, "mean", p->mean);
}

static const char *outcome_name(ba_outcome_t o)
{
    switch (o) {
    case BA_OK: return "completed";
    case BA_DISCONNECTED: return "aborted_by_client";
    case BA_TIMEOUT: return "timed_out";
    case BA_HTTP_ERROR: return "http_error";
    case BA_STREAM_ERROR: return "stream_error";
    case BA_CONN_ERROR: return "connection_error";
    }
    return "?";
}

/* A failure's class: "HTTP 502", "SSE error", "connection". */
static void fail_class(const ba_req_t *q, char *b, size_t n)
{
    if (q->outcome == BA_HTTP_ERROR)
        snprintf(b, n, "HTTP %d", q->http_status);
    else if (q->outcome == BA_STREAM_ERROR)
        snprintf(b, n, "SSE error event");
    else
        snprintf(b, n, "connection");
}

static void plot(ba_run_t *run, const char *png)
{
    if (ba_run_shell("command -v gnuplot >/dev/null 2>&1", 10) != 0) {
        fprintf(stderr, "duet-bench-agents: gnuplot is not installed (apt-get install gnuplot-nox): no plot\n");
        return;
    }
    char dir[] = "/tmp/duet-bench-plot.XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "duet-bench-agents: no temporary directory for the plot: %s\n", strerror(errno));
        return;
    }
    char ok_p[PATH_MAX], bad_p[PATH_MAX], gp[PATH_MAX];
    snprintf(ok_p, sizeof ok_p, "%s/ok.dat", dir);
    snprintf(bad_p, sizeof bad_p, "%s/bad.dat", dir);
    snprintf(gp, sizeof gp, "%s/plot.gp", dir);
    FILE *fo = fopen(ok_p, "w"), *fb = fopen(bad_p, "w"), *fg = fopen(gp, "w");
    if (!fo || !fb || !fg) {
        if (fo)
            fclose(fo);
        if (fb)
            fclose(fb);
        if (fg)
            fclose(fg);
        fprintf(stderr, "duet-bench-agents: cannot write the plot's data in %s\n", dir);
        return;
    }
    int n_bad = 0;
    for (size_t i = 0; i < run->n_reqs; i++) {
        const ba_req_t *q = run->reqs[i];
        double e2e = (q->t_end - q->t_start) * 1000.0;
        if (q->outcome == BA_OK)
            fprintf(fo, "%.3f %.2f %.2f\n", q->t_start, e2e, q->t_first >= 0 ? (q->t_first - q->t_start) * 1000.0 : e2e);
        else if (q->outcome != BA_DISCONNECTED) {
            fprintf(fb, "%.3f %.2f\n", q->t_start, e2e);
            n_bad++;
        }
    }
    fprintf(fg, "set terminal pngcairo size 1200,640 noenhanced\nset output '%s'\n", png);
    fprintf(fg, "set title 'duet bench agents%s%s: latency by request start'\n", run->o->scenario ? " " : "",
            run->o->scenario ? run->o->scenario : "");
    fprintf(fg, "set xlabel 'request start (s since the run began)'\nset ylabel 'ms'\nset grid\nset key top left\n");
    for (int i = 0; i < run->n_chaos; i++)
        if (run->chaos[i].killed_s >= 0)
            fprintf(fg, "set arrow from %.3f, graph 0 to %.3f, graph 1 nohead lc rgb 'red' dt 2\n"
                        "set label '%s' at %.3f, graph 0.95 tc rgb 'red'\n",
                    run->chaos[i].killed_s, run->chaos[i].killed_s, run->chaos[i].kind, run->chaos[i].killed_s);
    fprintf(fg, "plot '%s' using 1:2 with points pt 7 ps 0.5 title 'end to end', '%s' using 1:3 with points pt 7 "
                "ps 0.5 title 'time to first token'",
            ok_p, ok_p);
    if (n_bad)
        fprintf(fg, ", '%s' using 1:2 with points pt 2 ps 1.2 lc rgb 'red' title 'failed or timed out'", bad_p);
    fprintf(fg, "\n");
    fclose(fo);
    fclose(fb);
    fclose(fg);
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "gnuplot '%s'", gp);
    int rc = ba_run_shell(cmd, 60);
    if (rc != 0)
        fprintf(stderr, "duet-bench-agents: gnuplot failed (exit %d); its script is %s\n", rc, gp);
    else {
        fprintf(stderr, "duet-bench-agents: latency plot in %s\n", png);
        unlink(ok_p);
        unlink(bad_p);
        unlink(gp);
        rmdir(dir);
    }
}

static void row(const char *name, const pct_t *p, int have)
{
    if (!have || !p->n)
        printf("  %-26s %10s\n", name, "n/a");
    else
        printf("  %-26s %10.1f %10.1f %10.1f %10.1f %8zu\n", name, p->p50 * 1000, p->p90 * 1000, p->p99 * 1000,
               p->max * 1000, p->n);
}

int ba_report(ba_run_t *run)
{
    ba_opts_t *o = run->o;
    vec_t ttft = {0}, itl = {0}, e2e = {0};
    long completed = 0, disc = 0, disc_before = 0, disc_mid = 0, disc_planned = 0, timeouts = 0, failed = 0,
         chaos_failed = 0, out_tokens = 0, meeting_slo = 0, r504 = 0, dsml = 0, dsml_model = 0, dsml_unexplained = 0;
    json_t *by_status = json_object(), *chaos_by_status = json_object(), *dsml_codes = json_object();
    json_t *corrupt_list = json_array(), *fail_list = json_array();
    for (size_t i = 0; i < run->n_reqs; i++) {
        ba_req_t *q = run->reqs[i];
        disc_planned += q->disc_plan != BA_DISC_NONE;
        if (q->outcome == BA_OK) {
            completed++;
            out_tokens += q->n_out;
            double e = q->t_end - q->t_start;
            vpush(&e2e, e);
            double tt = q->t_first >= 0 ? q->t_first - q->t_start : e;
            if (o->stream && q->t_first >= 0)
                vpush(&ttft, tt);
            for (int k = 0; k < q->n_gaps; k++)
                vpush(&itl, q->gaps[k]);
            double mean_itl = q->n_out > 1 && q->t_first >= 0 ? (q->t_last - q->t_first) / (q->n_out - 1) : 0;
            int slo_ok = o->stream ? (tt * 1000 <= o->slo_ttft_ms && mean_itl * 1000 <= o->slo_itl_ms)
                                   : (e * 1000 <= o->slo_ttft_ms + o->slo_itl_ms * (q->n_out > 1 ? q->n_out - 1 : 0));
            meeting_slo += slo_ok;
            if (q->dsml_code[0]) {
                dsml++;
                json_object_set_new(dsml_codes, q->dsml_code,
                                    json_integer(json_integer_value(json_object_get(dsml_codes, q->dsml_code)) + 1));
                if (q->ref_state == 1)
                    dsml_model++;
                else if (o->compare == BA_COMPARE_EXACT)
                    dsml_unexplained++;
            }
            if (q->ref_state == 2 && json_array_size(corrupt_list) < 50) {
                json_t *got = json_array(), *exp = json_array();
                for (int k = q->first_diff; k < q->n_out && k < q->first_diff + 8; k++)
                    json_array_append_new(got, json_integer(q->out[k]));
                for (int k = q->first_diff; k < q->n_ref && k < q->first_diff + 8; k++)
                    json_array_append_new(exp, json_integer(q->ref[k]));
                json_array_append_new(corrupt_list,
                                      json_pack("{s:i, s:i, s:s, s:I, s:i, s:i, s:i, s:i, s:o, s:o}", "session",
                                                q->session, "turn", q->turn, "rid", q->rid, "seed",
                                                (json_int_t)q->seed, "prompt_tokens", q->n_prompt, "output_tokens",
                                                q->n_out, "reference_tokens", q->n_ref, "first_difference",
                                                q->first_diff, "got_from_there", got, "expected_from_there", exp));
            }
        } else if (q->outcome == BA_DISCONNECTED) {
            disc++;
            disc_before += q->disc_done == BA_DISC_BEFORE_FIRST;
            disc_mid += q->disc_done == BA_DISC_MID_STREAM;
        } else if (q->outcome == BA_TIMEOUT) {
            timeouts++;
            if (json_array_size(fail_list) < 50)
                json_array_append_new(fail_list, json_pack("{s:i, s:i, s:s, s:s, s:s, s:f}", "session", q->session,
                                                           "turn", q->turn, "rid", q->rid, "kind", "timed_out",
                                                           "error", q->err, "start_s", q->t_start));
        } else {
            char cls[32];
            fail_class(q, cls, sizeof cls);
            json_t *m = q->chaos ? chaos_by_status : by_status;
            json_object_set_new(m, cls, json_integer(json_integer_value(json_object_get(m, cls)) + 1));
            if (q->chaos)
                chaos_failed++;
            else
                failed++;
            r504 += q->outcome == BA_HTTP_ERROR && q->http_status == 504;
            if (json_array_size(fail_list) < 50)
                json_array_append_new(fail_list,
                                      json_pack("{s:i, s:i, s:s, s:s, s:s, s:b, s:f, s:f}", "session", q->session,
                                                "turn", q->turn, "rid", q->rid, "kind", outcome_name(q->outcome),
                                                "error", q->err, "chaos", q->chaos, "start_s", q->t_start, "end_s",
                                                q->t_end));
        }
    }
    pct_t p_ttft = pct(&ttft), p_itl = pct(&itl), p_e2e = pct(&e2e);
    long first_sum = 0, first_n = 0, prompt_max = 0;
    for (size_t i = 0; i < run->n_reqs; i++) {
        const ba_req_t *q = run->reqs[i];
        if (q->n_prompt && q->turn == 0) {
            first_sum += q->n_prompt;
            first_n++;
        }
        if (q->n_prompt > prompt_max)
            prompt_max = q->n_prompt;
    }
    double first_mean = first_n ? (double)first_sum / (double)first_n : 0;
    double dur = run->duration_s > 0 ? run->duration_s : 1e-9;
    long leaked_pages = 0, leaked_slots = 0;
    const ba_workers_t *ws = &run->workers;
    for (int i = 0; i < ws->n; i++) {
        leaked_pages += ws->w[i].pages_used + ws->w[i].pages_quarantined;
        leaked_slots += (ws->w[i].slots_used > 0 ? ws->w[i].slots_used : 0) +
                        (ws->w[i].slots_quarantined > 0 ? ws->w[i].slots_quarantined : 0);
    }
    /* clean? each problem in a sentence */
    json_t *problems = json_array();
    char b[768];
#define PROBLEM(...)                                                                                               \
    do {                                                                                                           \
        snprintf(b, sizeof b, __VA_ARGS__);                                                                        \
        json_array_append_new(problems, json_string(b));                                                           \
    } while (0)
    if (run->corrupted)
        PROBLEM("%ld corrupted outputs (token ids differ from duet-generate's)", run->corrupted);
    if (run->ref_failed)
        PROBLEM("%ld completed requests could not be checked (no reference)", run->ref_failed);
    if (timeouts)
        PROBLEM("%ld requests timed out (no end within %.0f s)", timeouts, o->timeout_s);
    if (failed)
        PROBLEM("%ld requests failed outside any chaos window", failed);
    if (dsml_unexplained)
        PROBLEM("%ld DSML failures whose ids differ from the reference", dsml_unexplained);
    if (!ws->settled)
        PROBLEM("the cluster did not become idle within %.0f s (decode holds %ld pages, %ld slots; the router holds "
                "%ld requests)%s%s",
                o->settle_s, leaked_pages, leaked_slots, ws->router_requests, ws->err[0] ? ": " : "", ws->err);
    if (run->growth_violations)
        PROBLEM("%ld turns whose prompt did not grow over the previous turn's", run->growth_violations);
    if (completed == 0)
        PROBLEM("no request completed");
    for (int i = 0; i < run->n_chaos; i++)
        if (run->chaos[i].note[0] && (run->chaos[i].kill_rc || run->chaos[i].restart_rc))
            PROBLEM("%s: %s", run->chaos[i].kind, run->chaos[i].note);
#undef PROBLEM
    int clean = json_array_size(problems) == 0;
    const char *mode = o->compare != BA_COMPARE_EXACT ? "none"
                       : strcmp(o->ref_device, "cpu") == 0
                           ? "exact (CPU backend)"
                       : o->ref_tp > 1
                           ? "exact (GPU, tensor-parallel batch-invariant engine: PD equals single-process duet-generate "
                             "--device cuda --tp N)"
                           : "exact (GPU, batch-invariant engine: PD equals single-process duet-generate --device cuda)";

    /* ---- terminal */
    printf("\nduet bench agents%s%s  (%s, %d sessions x %d turns, %s %g, %d tokens out, %s, seed %llu)\n",
           o->scenario ? ": " : "", o->scenario ? o->scenario : "", o->url, o->sessions, o->turns,
           o->rate > 0 ? "rate" : "concurrency", o->rate > 0 ? o->rate : (double)o->concurrency, o->max_tokens,
           o->stream ? "streamed" : "not streamed", (unsigned long long)o->seed);
    printf("  load phase %.1f s; %zu requests sent; prompt tokens: first turn %.0f (mean), largest %ld\n",
           run->duration_s, run->n_reqs, first_mean, prompt_max);
    printf("\n  %-26s %10s %10s %10s %10s %8s\n", "latency (ms)", "p50", "p90", "p99", "max", "n");
    row("time to first token", &p_ttft, o->stream);
    row("inter-token latency", &p_itl, o->stream);
    row("end to end", &p_e2e, 1);
    printf("\n  output tokens/s            %10.1f   (%ld tokens of completed requests)\n", (double)out_tokens / dur,
           out_tokens);
    printf("  requests/s                 %10.2f\n", (double)completed / dur);
    printf("  goodput (req/s in SLO)     %10.2f   (TTFT <= %.0f ms and mean ITL <= %.0f ms: %ld of %ld)\n",
           (double)meeting_slo / dur, o->slo_ttft_ms, o->slo_itl_ms, meeting_slo, completed);
    printf("\n  completed                  %10ld\n", completed);
    printf("  aborted by client          %10ld   (planned %ld: before the first token %ld, mid-stream %ld)\n", disc,
           disc_planned, disc_before, disc_mid);
    printf("  timed out                  %10ld\n", timeouts);
    printf("  failed                     %10ld", failed);
    {
        const char *k;
        json_t *v;
        json_object_foreach(by_status, k, v) printf("   %s: %lld", k, (long long)json_integer_value(v));
    }
    printf("\n  failed by chaos            %10ld", chaos_failed);
    {
        const char *k;
        json_t *v;
        json_object_foreach(chaos_by_status, k, v) printf("   %s: %lld", k, (long long)json_integer_value(v));
    }
    printf("\n  past the router's deadline %10ld   (HTTP 504)\n", r504);
    printf("\n  comparison                 %s\n", mode);
    if (o->compare == BA_COMPARE_EXACT)
        printf("  compared / equal           %10ld / %ld   (references: %ld cached, %ld run, %.1f s)\n", run->compared,
               run->equal, run->ref_cached, run->ref_run, run->ref_s);
    printf("  corrupted outputs          %10ld\n", run->corrupted);
    printf("  DSML parse failures        %10ld   (model wrote a malformed block: %ld; ids differ: %ld)\n", dsml,
           dsml_model, dsml_unexplained);
    printf("  prompt growth turn to turn %10ld checked, %ld violations\n", run->growth_checked,
           run->growth_violations);
    printf("\n  decode workers (%s), %s after %.1f s:\n", ws->source ? ws->source : "not read",
           ws->settled ? "idle" : "NOT idle", ws->settle_s);
    for (int i = 0; i < ws->n; i++) {
        const ba_worker_state_t *w = &ws->w[i];
        if (w->slots_used >= 0)
            printf("    %-40s pages used %ld, quarantined %ld; slots used %ld, quarantined %ld; requests %ld\n",
                   w->name, w->pages_used, w->pages_quarantined, w->slots_used, w->slots_quarantined, w->requests);
        else
            printf("    %-40s pages used %ld, quarantined %ld; requests %ld\n", w->name, w->pages_used,
                   w->pages_quarantined, w->requests);
    }
    if (ws->err[0])
        printf("    %s\n", ws->err);
    printf("  requests the router holds  %10ld   (GET /v1/workers router_requests; -1: not read)\n", ws->router_requests);
    printf("  pages leaked or quarantined %9ld\n", leaked_pages);
    for (int i = 0; i < run->n_chaos; i++) {
        const ba_chaos_t *c = &run->chaos[i];
        printf("  chaos %-14s at %.1f s: killed %.1f s, restarted %.1f s, ready %.1f s, window to %.1f s%s%s\n",
               c->kind, c->at_s, c->killed_s, c->restarted_s, c->ready_s, c->window_end_s, c->note[0] ? "; " : "",
               c->note);
    }
    if (clean)
        printf("\n  CLEAN\n");
    else {
        printf("\n  NOT CLEAN:\n");
        size_t i;
        json_t *x;
        json_array_foreach(problems, i, x) printf("   - %s\n", json_string_value(x));
    }
    fflush(stdout);

    /* ---- JSON */
    if (o->json_path) {
        json_t *chaos = json_array();
        for (int i = 0; i < run->n_chaos; i++) {
            const ba_chaos_t *c = &run->chaos[i];
            json_array_append_new(chaos, json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:s}", "kind", c->kind,
                                                   "at_s", c->at_s, "killed_s", c->killed_s, "restarted_s",
                                                   c->restarted_s, "ready_s", c->ready_s, "window_end_s",
                                                   c->window_end_s, "kill_rc", c->kill_rc, "restart_rc",
                                                   c->restart_rc, "note", c->note));
        }
        json_t *workers = json_array();
        for (int i = 0; i < ws->n; i++) {
            const ba_worker_state_t *w = &ws->w[i];
            json_array_append_new(workers, json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", w->name, "pages_used",
                                                     (int)w->pages_used, "pages_quarantined",
                                                     (int)w->pages_quarantined, "slots_used", (int)w->slots_used,
                                                     "slots_quarantined", (int)w->slots_quarantined, "requests",
                                                     (int)w->requests));
        }
        json_t *cfg = json_pack(
            "{s:s, s:s?, s:i, s:f, s:i, s:i, s:i, s:i, s:b, s:b, s:f, s:f, s:I, s:s, s:s, s:s?, s:f, s:f, s:f, s:f, "
            "s:f, s:s, s:i}",
            "url", o->url, "scenario", o->scenario, "concurrency", o->concurrency, "rate", o->rate, "sessions",
            o->sessions, "turns", o->turns, "context", o->context, "max_tokens", o->max_tokens, "thinking",
            o->thinking, "stream", o->stream, "temperature", o->temperature, "timeout_s", o->timeout_s, "seed",
            (json_int_t)o->seed, "kv_dtype", o->kv_dtype, "index_k_dtype", o->index_k_dtype, "model", o->model,
            "disconnect_fraction", o->disconnect_fraction, "kill_decode_at", o->kill_decode_at, "redis_restart_at",
            o->redis_restart_at, "slo_ttft_ms", o->slo_ttft_ms, "slo_itl_ms", o->slo_itl_ms, "reference_device",
            o->ref_device, "reference_tp", o->ref_tp);
        json_t *lat = json_pack("{s:o, s:o, s:o}", "ttft", pct_json(&p_ttft), "itl", pct_json(&p_itl), "e2e",
                                pct_json(&p_e2e));
        json_t *root = json_pack(
            "{s:i, s:o, s:f, s:f, s:I, s:o, "
            "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:I}, "
            "s:{s:I, s:I, s:I}, "
            "s:{s:I, s:f, s:f, s:f, s:I}, "
            "s:{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o}, "
            "s:{s:I, s:I, s:I, s:o}, "
            "s:{s:I, s:I}, "
            "s:{s:s, s:b, s:f, s:o, s:I, s:I, s:s, s:I}, "
            "s:o, s:o, s:b, s:o, s:{s:f, s:I}}",
            "version", 1, "config", cfg, "start_unix_s", run->t0_wall, "duration_s", run->duration_s,
            "sessions_started", (json_int_t)run->sessions_started, "latency_s", lat,
            "requests", "sent", (json_int_t)run->n_reqs, "completed", (json_int_t)completed, "aborted_by_client",
            (json_int_t)disc, "timed_out", (json_int_t)timeouts, "failed", (json_int_t)failed, "failed_by_chaos",
            (json_int_t)chaos_failed, "failed_by_status", by_status, "failed_by_chaos_by_status", chaos_by_status,
            "past_deadline_504", (json_int_t)r504,
            "disconnects", "planned", (json_int_t)disc_planned, "before_first_token", (json_int_t)disc_before,
            "mid_stream", (json_int_t)disc_mid,
            "throughput", "output_tokens", (json_int_t)out_tokens, "output_tokens_per_s", (double)out_tokens / dur,
            "requests_per_s", (double)completed / dur, "goodput_requests_per_s", (double)meeting_slo / dur,
            "requests_meeting_slo", (json_int_t)meeting_slo,
            "correctness", "mode", mode, "compared", (json_int_t)run->compared, "equal", (json_int_t)run->equal,
            "corrupted", (json_int_t)run->corrupted, "reference_failed", (json_int_t)run->ref_failed,
            "references_cached", (json_int_t)run->ref_cached, "references_run", (json_int_t)run->ref_run,
            "reference_s", run->ref_s, "corrupted_requests", corrupt_list,
            "dsml", "failures", (json_int_t)dsml, "model_wrote_malformed", (json_int_t)dsml_model, "unexplained",
            (json_int_t)dsml_unexplained, "codes", dsml_codes,
            "prompt_growth", "checked", (json_int_t)run->growth_checked, "violations",
            (json_int_t)run->growth_violations,
            "workers", "source", ws->source ? ws->source : "", "settled", ws->settled, "settle_s", ws->settle_s,
            "decode", workers, "leaked_pages", (json_int_t)leaked_pages, "leaked_slots", (json_int_t)leaked_slots,
            "error", ws->err, "router_requests", (json_int_t)ws->router_requests,
            "chaos", chaos, "failures", fail_list, "clean", clean, "problems", problems,
            "prompt_tokens", "first_turn_mean", first_mean, "max", (json_int_t)prompt_max);
        if (!root || json_dump_file(root, o->json_path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
            fprintf(stderr, "duet-bench-agents: cannot write %s\n", o->json_path);
        json_decref(root);
    } else {
        json_decref(by_status);
        json_decref(chaos_by_status);
        json_decref(dsml_codes);
        json_decref(corrupt_list);
        json_decref(fail_list);
        json_decref(problems);
    }
    if (o->plot_path)
        plot(run, o->plot_path);
    free(ttft.v);
    free(itl.v);
    free(e2e.v);
    return clean ? 0 : 1;
}
