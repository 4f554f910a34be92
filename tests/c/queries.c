/* The omp_* query and setting routines: thread numbers and team sizes
 * inside and outside regions, omp_set_num_threads and num_threads(k),
 * if(0) regions, levels and ancestors (with a nested region: nested
 * parallelism is off, so the inner team of an active region has one
 * thread), wtime/wtick,
 * num_procs, dynamic, nested, max active levels, schedule, thread limit.
 * Reads OMP_NUM_THREADS from the environment to check
 * omp_get_max_threads. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define MAXT 64

static int seen[MAXT];

/* Runs a region and checks that its thread numbers are 0..n-1, once
 * each; returns n. */
static int team_of_region(int clause_threads)
{
    int n = -1;
    memset(seen, 0, sizeof seen);
#pragma omp parallel num_threads(clause_threads > 0 ? clause_threads : omp_get_max_threads())
    {
        int t = omp_get_thread_num();
        if (t >= 0 && t < MAXT) {
#pragma omp atomic
            seen[t]++;
        }
#pragma omp single
        n = omp_get_num_threads();
    }
    int ok = n >= 1 && n <= MAXT;
    for (int t = 0; t < MAXT && ok; t++)
        ok &= seen[t] == (t < n);
    CHECK(ok, "thread numbers 0..n-1 appear exactly once");
    return n;
}

static void team_sizes(void)
{
    CHECK(omp_get_num_threads() == 1, "omp_get_num_threads outside regions");
    CHECK(omp_get_thread_num() == 0, "omp_get_thread_num outside regions");
    CHECK(!omp_in_parallel(), "omp_in_parallel outside regions");
    int max = omp_get_max_threads();
    CHECK(max >= 1, "omp_get_max_threads >= 1");
    const char *env = getenv("OMP_NUM_THREADS");
    if (env != NULL && strchr(env, ',') == NULL)
        CHECK(max == atoi(env), "omp_get_max_threads is OMP_NUM_THREADS");

    /* A region without clause has omp_get_max_threads() threads. */
    int n = -1, inner_max = -1, in_par = -1, consistent = 1;
    memset(seen, 0, sizeof seen);
#pragma omp parallel reduction(& : consistent)
    {
        int t = omp_get_thread_num();
        if (t >= 0 && t < MAXT) {
#pragma omp atomic
            seen[t]++;
        }
#pragma omp single
        {
            n = omp_get_num_threads();
            inner_max = omp_get_max_threads();
            in_par = omp_in_parallel();
        }
        consistent &= omp_in_parallel() == (omp_get_num_threads() > 1);
    }
    CHECK(n == max, "a region has omp_get_max_threads() threads");
    CHECK(inner_max == max, "omp_get_max_threads inside a region");
    CHECK(in_par == (n > 1) && consistent, "omp_in_parallel inside a region");
    int ok = 1;
    for (int t = 0; t < MAXT; t++)
        ok &= seen[t] == (t < n);
    CHECK(ok, "thread numbers 0..n-1 appear exactly once");

    /* omp_set_num_threads */
    for (int k = 1; k <= 3; k++) {
        omp_set_num_threads(k);
        CHECK(omp_get_max_threads() == k, "omp_get_max_threads after omp_set_num_threads");
        CHECK(team_of_region(0) == k, "region after omp_set_num_threads(k) has k threads");
    }
    omp_set_num_threads(max);
    CHECK(omp_get_max_threads() == max, "omp_set_num_threads restores");

    /* num_threads(k) */
    for (int k = 1; k <= 3; k++)
        CHECK(team_of_region(k) == k, "num_threads(k) gives k threads");
    CHECK(team_of_region(max) == max, "num_threads(max)");
    CHECK(omp_get_max_threads() == max, "num_threads does not change max threads");

    /* if(0) */
    int if_n = -1, if_in_par = -1, if_level = -1, if_active = -1;
    int cond = 0;
#pragma omp parallel if (cond)
    {
        if_n = omp_get_num_threads();
        if_in_par = omp_in_parallel();
        if_level = omp_get_level();
        if_active = omp_get_active_level();
    }
    CHECK(if_n == 1 && if_in_par == 0, "if(0) region has one thread");
    CHECK(if_level == 1 && if_active == 0, "levels of an if(0) region");
    printf("team sizes: ok\n");
}

static void levels(void)
{
    CHECK(omp_get_level() == 0 && omp_get_active_level() == 0, "levels outside");
    CHECK(omp_get_ancestor_thread_num(0) == 0 && omp_get_team_size(0) == 1,
          "level 0 ancestor and team size");
    CHECK(omp_get_ancestor_thread_num(1) == -1 && omp_get_team_size(1) == -1,
          "levels beyond the current one outside regions");
    int bad = 0;
#pragma omp parallel reduction(| : bad)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        bad |= omp_get_level() != 1;
        bad |= omp_get_active_level() != (n > 1);
        bad |= omp_get_ancestor_thread_num(0) != 0;
        bad |= omp_get_ancestor_thread_num(1) != t;
        bad |= omp_get_ancestor_thread_num(2) != -1;
        bad |= omp_get_team_size(0) != 1;
        bad |= omp_get_team_size(1) != n;
        bad |= omp_get_team_size(2) != -1;
        /* Nested region with max-active-levels 1: the inner team has one
         * thread if the outer region is active (n > 1), else it is the
         * first active region and gets its num_threads(2). */
        int expect_inner = n > 1 ? 1 : 2;
        int inner_n = -1, inner_level = -1, inner_active = -1;
        int inner_anc1 = -2, inner_anc2 = -2, inner_size1 = -2, inner_size2 = -2;
        int inner_in_par = -1;
#pragma omp parallel num_threads(2)
        if (omp_get_thread_num() == 0) {
            inner_n = omp_get_num_threads();
            inner_level = omp_get_level();
            inner_active = omp_get_active_level();
            inner_anc1 = omp_get_ancestor_thread_num(1);
            inner_anc2 = omp_get_ancestor_thread_num(2);
            inner_size1 = omp_get_team_size(1);
            inner_size2 = omp_get_team_size(2);
            inner_in_par = omp_in_parallel();
        }
        bad |= inner_n != expect_inner;
        bad |= inner_level != 2 || inner_active != 1;
        bad |= inner_anc1 != t || inner_anc2 != 0;
        bad |= inner_size1 != n || inner_size2 != expect_inner;
        bad |= inner_in_par != 1;
    }
    CHECK(!bad, "levels, ancestors and team sizes in regions");
    printf("levels: ok\n");
}

static void clocks_and_settings(void)
{
    double t0 = omp_get_wtime();
    double t1 = t0;
    for (long i = 0; i < 100000000L && t1 <= t0; i++)
        t1 = omp_get_wtime();
    CHECK(t1 > t0, "omp_get_wtime increases");
    CHECK(omp_get_wtick() > 0 && omp_get_wtick() < 1, "omp_get_wtick");
    double in_region = 0;
#pragma omp parallel
#pragma omp single
    in_region = omp_get_wtime();
    CHECK(in_region >= t1, "omp_get_wtime in a region");
    CHECK(omp_get_num_procs() >= 1, "omp_get_num_procs");
    CHECK(omp_get_thread_limit() >= omp_get_max_threads(), "omp_get_thread_limit");

    CHECK(omp_get_dynamic() == 0, "dynamic adjustment off by default");
    omp_set_dynamic(1);
    int d1 = omp_get_dynamic();
    omp_set_dynamic(0);
    CHECK(omp_get_dynamic() == 0, "omp_set_dynamic(0)");
    /* An implementation may refuse dynamic adjustment. */
    CHECK(d1 == 0 || d1 == 1, "omp_set_dynamic(1)");

    CHECK(omp_get_nested() == 0, "nested parallelism off by default");
    CHECK(omp_get_max_active_levels() >= 1, "omp_get_max_active_levels");
    omp_set_nested(1);
    int nested = omp_get_nested();
    omp_set_nested(0);
    CHECK(omp_get_nested() == 0, "omp_set_nested(0)");
    CHECK(nested == 0 || nested == 1, "omp_set_nested(1)");
    omp_set_max_active_levels(1);
    CHECK(omp_get_max_active_levels() == 1, "omp_set_max_active_levels(1)");
    CHECK(omp_get_nested() == 0, "nested off with one active level");
    CHECK(omp_get_cancellation() == 0, "cancellation off without OMP_CANCELLATION");

    static const struct {
        omp_sched_t kind;
        int chunk;
    } sets[] = {
        {omp_sched_static, 0},  {omp_sched_static, 8}, {omp_sched_dynamic, 1},
        {omp_sched_dynamic, 5}, {omp_sched_guided, 3}, {omp_sched_auto, 0},
    };
    for (unsigned k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        omp_set_schedule(sets[k].kind, sets[k].chunk);
        omp_sched_t kind;
        int chunk;
        omp_get_schedule(&kind, &chunk);
        CHECK(kind == sets[k].kind, "omp_get_schedule kind");
        if (sets[k].chunk > 0)
            CHECK(chunk == sets[k].chunk, "omp_get_schedule chunk");
        /* A region inherits the schedule. */
        omp_sched_t in_kind = 0;
        int in_chunk = -1;
#pragma omp parallel
#pragma omp single
        omp_get_schedule(&in_kind, &in_chunk);
        CHECK(in_kind == kind && in_chunk == chunk, "omp_get_schedule in a region");
    }
    printf("clocks and settings: ok\n");
}

int main(void)
{
    team_sizes();
    levels();
    clocks_and_settings();
    return finish();
}
