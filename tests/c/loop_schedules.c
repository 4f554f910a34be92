/* Work-sharing loops: every schedule kind and modifier, runtime schedules
 * set with omp_set_schedule, nowait, collapse(2) and collapse(3), signed
 * and unsigned long long induction variables (GOMP_loop_ull_*), negative
 * and non-unit strides, the combined `parallel for` forms and
 * lastprivate. Every loop checks that each iteration ran exactly once; the
 * static schedules also check which thread ran which iteration, monotonic
 * schedules the order each thread saw. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define PRAGMA(x) _Pragma(#x)
#define MAXN 4096
#define MAXT 64

static int hits[MAXN];
static int owner[MAXN];
static long last_idx[MAXT];
static int order_bad[MAXT];
static long value_sum;
static long count;
static int team;

enum { ANY = 0, MONO = 1, STATIC_BLOCK = 2, STATIC_CHUNK = 4 };

static void begin(long n)
{
    if (n > MAXN)
        abort();
    count = n;
    memset(hits, 0, sizeof hits);
    memset(owner, -1, sizeof owner);
    for (int t = 0; t < MAXT; t++) {
        last_idx[t] = -1;
        order_bad[t] = 0;
    }
    value_sum = 0;
    team = 0;
}

static void visit(long idx, long value)
{
    int t = omp_get_thread_num();
    if (idx < 0 || idx >= count) {
        check_failed("iteration outside the iteration space");
        return;
    }
#pragma omp atomic
    hits[idx]++;
    owner[idx] = t;
    if (idx <= last_idx[t])
        order_bad[t] = 1;
    last_idx[t] = idx;
#pragma omp atomic
    value_sum += value;
    if (t == 0) /* thread 0 runs iteration 0 under the static schedules */
        team = omp_get_num_threads();
}

static void note_team(void)
{
    CHECK(omp_get_num_threads() >= 1 && omp_in_parallel() == (omp_get_num_threads() > 1),
          "team size in a loop's region");
}

/* Checks and prints the loop just run; `chunk` is the static chunk size. */
static void end(const char *label, int flags, long chunk)
{
    int ok = 1;
    for (long i = 0; i < count; i++)
        if (hits[i] != 1)
            ok = 0;
    CHECK(ok, label);
    if (flags & (MONO | STATIC_BLOCK | STATIC_CHUNK))
        for (int t = 0; t < MAXT; t++)
            CHECK(!order_bad[t], "monotonic schedule: a thread went backwards");
    if (flags & STATIC_BLOCK) {
        /* One contiguous block per thread, in thread order. */
        for (long i = 1; i < count; i++)
            CHECK(owner[i] >= owner[i - 1], "schedule(static): blocks in thread order");
    }
    if ((flags & STATIC_CHUNK) && team > 0) {
        for (long i = 0; i < count; i++)
            CHECK(owner[i] == (i / chunk) % team, "schedule(static, k): round robin");
    }
    printf("%s: n=%ld sum=%ld\n", label, count, value_sum);
}

/* A loop over int i from lb while i < ub step st (st > 0), in a region. */
#define UP_LOOP(label, flags, chunk, lb, ub, st, ...)                       \
    do {                                                                    \
        begin(((ub) - (lb) + (st) - 1) / (st));                             \
        PRAGMA(omp parallel)                                                \
        {                                                                   \
            note_team(); /* keeps GCC from combining the constructs */      \
            PRAGMA(omp for __VA_ARGS__)                                     \
            for (int i = (lb); i < (ub); i += (st))                         \
                visit((i - (lb)) / (st), i);                                \
        }                                                                   \
        end(label, flags, chunk);                                           \
    } while (0)

/* A loop over long i from hi while i > lo step -st (st > 0). */
#define DOWN_LOOP(label, flags, chunk, hi, lo, st, ...)                     \
    do {                                                                    \
        begin(((hi) - (lo) + (st) - 1) / (st));                             \
        PRAGMA(omp parallel)                                                \
        {                                                                   \
            note_team(); /* keeps GCC from combining the constructs */      \
            PRAGMA(omp for __VA_ARGS__)                                     \
            for (long i = (hi); i > (lo); i -= (st))                        \
                visit(((hi) - i) / (st), i);                                \
        }                                                                   \
        end(label, flags, chunk);                                           \
    } while (0)

/* unsigned long long, far above LONG_MAX so it cannot be narrowed. */
#define ULL_BASE 0xF000000000000000ULL
#define ULL_UP(label, flags, chunk, n, st, ...)                             \
    do {                                                                    \
        begin(n);                                                           \
        PRAGMA(omp parallel)                                                \
        {                                                                   \
            note_team(); /* keeps GCC from combining the constructs */      \
            PRAGMA(omp for __VA_ARGS__)                                     \
            for (unsigned long long u = ULL_BASE;                           \
                 u < ULL_BASE + (unsigned long long)(n) * (st); u += (st))  \
                visit((long)((u - ULL_BASE) / (st)), (long)(u - ULL_BASE)); \
        }                                                                   \
        end(label, flags, chunk);                                           \
    } while (0)
#define ULL_DOWN(label, flags, chunk, n, st, ...)                           \
    do {                                                                    \
        begin(n);                                                           \
        PRAGMA(omp parallel)                                                \
        {                                                                   \
            note_team(); /* keeps GCC from combining the constructs */      \
            PRAGMA(omp for __VA_ARGS__)                                     \
            for (unsigned long long u = ULL_BASE + (unsigned long long)(n) * (st); \
                 u > ULL_BASE; u -= (st))                                   \
                visit((long)((ULL_BASE + (unsigned long long)(n) * (st) - u) / (st)), \
                      (long)(u - ULL_BASE));                                \
        }                                                                   \
        end(label, flags, chunk);                                           \
    } while (0)

/* The combined construct. */
#define PFOR_LOOP(label, flags, chunk, lb, ub, st, ...)                     \
    do {                                                                    \
        begin(((ub) - (lb) + (st) - 1) / (st));                             \
        PRAGMA(omp parallel for __VA_ARGS__)                                \
        for (int i = (lb); i < (ub); i += (st))                             \
            visit((i - (lb)) / (st), i);                                    \
        end(label, flags, chunk);                                           \
    } while (0)

static void schedules(void)
{
    UP_LOOP("static", STATIC_BLOCK, 0, 0, 1000, 1, schedule(static));
    UP_LOOP("static,1", STATIC_CHUNK, 1, 0, 1000, 1, schedule(static, 1));
    UP_LOOP("static,7", STATIC_CHUNK, 7, 3, 2000, 3, schedule(static, 7));
    UP_LOOP("dynamic", ANY, 0, 0, 1000, 1, schedule(dynamic));
    UP_LOOP("dynamic,16", ANY, 0, -500, 1500, 2, schedule(dynamic, 16));
    UP_LOOP("guided", ANY, 0, 0, 1000, 1, schedule(guided));
    UP_LOOP("guided,5", ANY, 0, 11, 3011, 1, schedule(guided, 5));
    UP_LOOP("runtime(default)", ANY, 0, 0, 1000, 1, schedule(runtime));
    UP_LOOP("auto", ANY, 0, 0, 1000, 1, schedule(auto));
    UP_LOOP("nonmonotonic:dynamic", ANY, 0, 0, 1000, 1, schedule(nonmonotonic : dynamic));
    UP_LOOP("nonmonotonic:dynamic,3", ANY, 0, 0, 1000, 1, schedule(nonmonotonic : dynamic, 3));
    UP_LOOP("monotonic:dynamic", MONO, 0, 0, 1000, 1, schedule(monotonic : dynamic));
    UP_LOOP("monotonic:dynamic,9", MONO, 0, 0, 1000, 1, schedule(monotonic : dynamic, 9));
    UP_LOOP("monotonic:guided", MONO, 0, 0, 1000, 1, schedule(monotonic : guided));
    UP_LOOP("monotonic:static,4", STATIC_CHUNK, 4, 0, 1000, 1, schedule(monotonic : static, 4));
    UP_LOOP("empty dynamic", ANY, 0, 5, 5, 1, schedule(dynamic));
    UP_LOOP("empty static", ANY, 0, 5, 5, 1, schedule(static));
    UP_LOOP("one iteration guided", ANY, 0, 5, 6, 1, schedule(guided));
    UP_LOOP("fewer than threads dynamic", ANY, 0, 0, 3, 1, schedule(dynamic));
}

static void strides(void)
{
    DOWN_LOOP("down static", STATIC_BLOCK, 0, 1000L, -5L, 3L, schedule(static));
    DOWN_LOOP("down static,5", STATIC_CHUNK, 5, 1000L, -5L, 3L, schedule(static, 5));
    DOWN_LOOP("down dynamic,4", ANY, 0, 1000L, -5L, 3L, schedule(dynamic, 4));
    DOWN_LOOP("down guided", ANY, 0, 3000L, 0L, 1L, schedule(guided));
    DOWN_LOOP("down monotonic:dynamic", MONO, 0, 999L, 0L, 7L, schedule(monotonic : dynamic));
    DOWN_LOOP("down runtime", ANY, 0, 999L, 0L, 2L, schedule(runtime));
    /* Bounds beyond int: signed long induction. */
    begin(1000);
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 8)
        for (long i = 5000000000L; i < 5000000000L + 3000; i += 3)
            visit((i - 5000000000L) / 3, i - 5000000000L);
    }
    end("long bounds dynamic,8", ANY, 0);
}

static void ull_loops(void)
{
    ULL_UP("ull static", STATIC_BLOCK, 0, 1000, 1ULL, schedule(static));
    ULL_UP("ull static,3", STATIC_CHUNK, 3, 1000, 5ULL, schedule(static, 3));
    ULL_UP("ull dynamic", ANY, 0, 1000, 1ULL, schedule(dynamic));
    ULL_UP("ull dynamic,7", ANY, 0, 1000, 3ULL, schedule(dynamic, 7));
    ULL_UP("ull guided", ANY, 0, 1000, 1ULL, schedule(guided));
    ULL_UP("ull guided,4", ANY, 0, 1000, 2ULL, schedule(guided, 4));
    ULL_UP("ull runtime", ANY, 0, 1000, 1ULL, schedule(runtime));
    ULL_UP("ull monotonic:dynamic", MONO, 0, 1000, 1ULL, schedule(monotonic : dynamic));
    ULL_UP("ull nonmonotonic:dynamic,2", ANY, 0, 1000, 1ULL, schedule(nonmonotonic : dynamic, 2));
    ULL_UP("ull monotonic:guided,3", MONO, 0, 1000, 1ULL, schedule(monotonic : guided, 3));
    ULL_DOWN("ull down static", STATIC_BLOCK, 0, 1000, 1ULL, schedule(static));
    ULL_DOWN("ull down dynamic,5", ANY, 0, 1000, 3ULL, schedule(dynamic, 5));
    ULL_DOWN("ull down guided", ANY, 0, 1000, 2ULL, schedule(guided));
    ULL_DOWN("ull down monotonic:dynamic", MONO, 0, 777, 1ULL, schedule(monotonic : dynamic));
}

static void runtime_schedules(void)
{
    static const struct {
        omp_sched_t kind;
        int chunk;
        const char *label;
        int flags;
    } kinds[] = {
        {omp_sched_static, 0, "runtime=static", STATIC_BLOCK},
        {omp_sched_static, 6, "runtime=static,6", STATIC_CHUNK},
        {omp_sched_dynamic, 0, "runtime=dynamic", ANY},
        {omp_sched_dynamic, 10, "runtime=dynamic,10", ANY},
        {omp_sched_guided, 0, "runtime=guided", ANY},
        {omp_sched_guided, 4, "runtime=guided,4", ANY},
        {omp_sched_auto, 0, "runtime=auto", ANY},
        {(omp_sched_t)(omp_sched_dynamic | omp_sched_monotonic), 2,
         "runtime=monotonic:dynamic,2", MONO},
    };
    omp_sched_t saved_kind;
    int saved_chunk;
    omp_get_schedule(&saved_kind, &saved_chunk);
    for (unsigned k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        omp_set_schedule(kinds[k].kind, kinds[k].chunk);
        omp_sched_t got;
        int chunk;
        omp_get_schedule(&got, &chunk);
        CHECK((got & ~omp_sched_monotonic) == (kinds[k].kind & ~omp_sched_monotonic),
              "omp_get_schedule kind after omp_set_schedule");
        if (kinds[k].chunk > 0)
            CHECK(chunk == kinds[k].chunk, "omp_get_schedule chunk after omp_set_schedule");
        UP_LOOP(kinds[k].label, kinds[k].flags, kinds[k].chunk, 0, 1500, 1,
                schedule(runtime));
        /* The ull entry points too. */
        ULL_UP(kinds[k].label, kinds[k].flags, kinds[k].chunk, 700, 1ULL,
               schedule(runtime));
        /* The monotonic runtime entry point. */
        UP_LOOP(kinds[k].label, kinds[k].flags, kinds[k].chunk, 0, 900, 1,
                schedule(monotonic : runtime));
        ULL_UP(kinds[k].label, kinds[k].flags, kinds[k].chunk, 600, 1ULL,
               schedule(monotonic : runtime));
        /* Combined parallel for with runtime. */
        PFOR_LOOP(kinds[k].label, kinds[k].flags, kinds[k].chunk, 0, 800, 1,
                  schedule(runtime));
        PFOR_LOOP(kinds[k].label, kinds[k].flags, kinds[k].chunk, 0, 500, 1,
                  schedule(monotonic : runtime));
    }
    omp_set_schedule(saved_kind, saved_chunk);
}

static void combined(void)
{
    PFOR_LOOP("parallel for static", STATIC_BLOCK, 0, 0, 1000, 1, schedule(static));
    PFOR_LOOP("parallel for static,5", STATIC_CHUNK, 5, 0, 1000, 1, schedule(static, 5));
    PFOR_LOOP("parallel for dynamic", ANY, 0, 0, 1000, 1, schedule(dynamic));
    PFOR_LOOP("parallel for dynamic,6", ANY, 0, 0, 1000, 1, schedule(dynamic, 6));
    PFOR_LOOP("parallel for guided", ANY, 0, 0, 1000, 1, schedule(guided));
    PFOR_LOOP("parallel for guided,3", ANY, 0, 0, 1000, 1, schedule(guided, 3));
    PFOR_LOOP("parallel for runtime", ANY, 0, 0, 1000, 1, schedule(runtime));
    PFOR_LOOP("parallel for auto", ANY, 0, 0, 1000, 1, schedule(auto));
    PFOR_LOOP("parallel for monotonic:dynamic", MONO, 0, 0, 1000, 1,
              schedule(monotonic : dynamic));
    PFOR_LOOP("parallel for nonmonotonic:dynamic,4", ANY, 0, 0, 1000, 1,
              schedule(nonmonotonic : dynamic, 4));
    PFOR_LOOP("parallel for monotonic:guided", MONO, 0, 0, 1000, 1,
              schedule(monotonic : guided));
    PFOR_LOOP("parallel for default", ANY, 0, 7, 1007, 5, );
}

static int a_arr[1000], b_arr[1000];

static void nowait_loops(void)
{
    int bad = 0;
    memset(a_arr, 0, sizeof a_arr);
    memset(b_arr, 0, sizeof b_arr);
#pragma omp parallel reduction(| : bad)
    {
        /* Same static schedule and iteration space: iteration i runs on the
         * same thread in both loops, so the second loop may read the first
         * loop's writes without a barrier. */
#pragma omp for schedule(static) nowait
        for (int i = 0; i < 1000; i++)
            a_arr[i] = i + 1;
#pragma omp for schedule(static) nowait
        for (int i = 0; i < 1000; i++)
            bad |= a_arr[i] != i + 1;
#pragma omp for schedule(static, 3) nowait
        for (int i = 0; i < 1000; i++)
            b_arr[i] = 2 * i;
#pragma omp for schedule(static, 3) nowait
        for (int i = 0; i < 1000; i++)
            bad |= b_arr[i] != 2 * i;
        /* Other threads may still read a_arr and b_arr above. */
#pragma omp barrier
        /* Dynamic nowait loops back to back, then an explicit barrier. */
#pragma omp for schedule(dynamic, 5) nowait
        for (int i = 0; i < 1000; i++)
            a_arr[i] = -i;
#pragma omp for schedule(guided) nowait
        for (int i = 0; i < 1000; i++)
            b_arr[i] = 3 * i;
#pragma omp barrier
#pragma omp for schedule(dynamic) nowait
        for (int i = 0; i < 1000; i++)
            bad |= a_arr[i] != -i || b_arr[i] != 3 * i;
    }
    CHECK(!bad, "nowait loops");
    printf("nowait: ok\n");
}

static int grid2[37][41];
static int grid3[9][11][13];

static void collapse_loops(void)
{
    int li = -1, lj = -1, lk = -1;
    long sum = 0;
    memset(grid2, 0, sizeof grid2);
#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(static) reduction(+ : sum)
        for (int i = 0; i < 37; i++)
            for (int j = 0; j < 41; j++) {
#pragma omp atomic
                grid2[i][j]++;
                sum += i * 100 + j;
            }
#pragma omp for collapse(2) schedule(dynamic, 7) reduction(+ : sum)
        for (int i = 36; i >= 0; i--)
            for (int j = 1; j < 41; j += 2) {
#pragma omp atomic
                grid2[i][j]++;
                sum += i * j;
            }
#pragma omp for collapse(2) schedule(guided) lastprivate(li, lj)
        for (li = 0; li < 37; li++)
            for (lj = 0; lj < 41; lj += 4) {
#pragma omp atomic
                grid2[li][lj] += 10;
            }
    }
    int ok = 1;
    for (int i = 0; i < 37; i++)
        for (int j = 0; j < 41; j++)
            ok &= grid2[i][j] == 1 + (j % 2 == 1) + 10 * (j % 4 == 0);
    CHECK(ok, "collapse(2) iterations");
    CHECK(li == 37 && lj == 44, "collapse(2) lastprivate loop variables");
    printf("collapse(2): sum=%ld last=%d,%d\n", sum, li, lj);

    sum = 0;
    memset(grid3, 0, sizeof grid3);
#pragma omp parallel for collapse(3) schedule(dynamic, 3) reduction(+ : sum)
    for (int i = 0; i < 9; i++)
        for (int j = 0; j < 11; j++)
            for (int k = 0; k < 13; k++) {
#pragma omp atomic
                grid3[i][j][k]++;
                sum += i * j * k;
            }
#pragma omp parallel
    {
#pragma omp for collapse(3) schedule(static, 5) lastprivate(li, lj, lk)
        for (li = 8; li >= 0; li--)
            for (lj = 0; lj < 11; lj += 5)
                for (lk = 2; lk < 13; lk += 3) {
#pragma omp atomic
                    grid3[li][lj][lk] += 100;
                }
#pragma omp for collapse(3) schedule(runtime)
        for (unsigned long long i = 0; i < 9; i++)
            for (unsigned long long j = 0; j < 11; j++)
                for (unsigned long long k = 0; k < 13; k++) {
#pragma omp atomic
                    grid3[i][j][k] += 1000;
                }
    }
    ok = 1;
    for (int i = 0; i < 9; i++)
        for (int j = 0; j < 11; j++)
            for (int k = 0; k < 13; k++)
                ok &= grid3[i][j][k] == 1001 + 100 * (j % 5 == 0 && k % 3 == 2);
    CHECK(ok, "collapse(3) iterations");
    CHECK(li == -1 && lj == 15 && lk == 14, "collapse(3) lastprivate loop variables");
    printf("collapse(3): sum=%ld last=%d,%d,%d\n", sum, li, lj, lk);
}

static void lastprivate_loops(void)
{
    int i, x = -1, y = -1;
    double d = -1;
    unsigned long long u, ux = 0;
#pragma omp parallel
    {
#pragma omp for lastprivate(i, x) schedule(dynamic, 3)
        for (i = 0; i < 1001; i += 4)
            x = i * 2;
#pragma omp for lastprivate(y, d) schedule(static, 2)
        for (int j = 100; j > 0; j--) {
            y = j;
            d = j * 0.5;
        }
#pragma omp for lastprivate(u, ux) schedule(guided)
        for (u = 10; u < 510; u += 7)
            ux = u * 3;
    }
    CHECK(i == 1004 && x == 2000, "lastprivate of a dynamic loop");
    CHECK(y == 1 && d == 0.5, "lastprivate of a static decreasing loop");
    CHECK(u == 514 && ux == 507 * 3, "lastprivate of an ull guided loop");
    printf("lastprivate: i=%d x=%d y=%d d=%.1f u=%llu ux=%llu\n", i, x, y, d, u, ux);

    int z = -1;
#pragma omp parallel for lastprivate(z) schedule(runtime)
    for (int j = 0; j < 333; j++)
        z = j;
    CHECK(z == 332, "lastprivate of a combined runtime loop");
    printf("lastprivate combined: z=%d\n", z);
}

int main(void)
{
    schedules();
    strides();
    ull_loops();
    runtime_schedules();
    combined();
    nowait_loops();
    collapse_loops();
    lastprivate_loops();
    return finish();
}
