/* critical (unnamed and named), atomic (update, read, write, capture on
 * int, long and double), single (with nowait and copyprivate), master and
 * barrier. */
#include <omp.h>
#include <string.h>

#include "check.h"

#define N 2000
#define MAXT 64

static void spin(int k)
{
    for (volatile int i = 0; i < k; i++)
        ;
}

static void critical_sections(void)
{
    long total = 0, ta = 0, tb = 0, tc = 0;
    int inside = 0, inside_a = 0, inside_b = 0, inside_c = 0;
    int overlap = 0;
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 7)
        for (int i = 0; i < N; i++) {
#pragma omp critical
            {
                if (inside)
                    overlap = 1;
                inside = 1;
                long t = total; /* a non-atomic read-modify-write */
                if (i % 64 == 0)
                    spin(200);
                total = t + i;
                inside = 0;
            }
        }
#pragma omp for schedule(static, 3)
        for (int i = 0; i < N; i++) {
            switch (i % 3) {
            case 0:
#pragma omp critical(alpha)
                {
                    if (inside_a)
                        overlap = 1;
                    inside_a = 1;
                    long t = ta;
                    if (i % 99 == 0)
                        spin(100);
                    ta = t + i;
                    inside_a = 0;
                }
                break;
            case 1:
#pragma omp critical(beta)
                {
                    if (inside_b)
                        overlap = 1;
                    inside_b = 1;
                    long t = tb;
                    tb = t + 2 * i;
                    inside_b = 0;
                }
                break;
            default:
#pragma omp critical(gamma_long_name_for_a_critical_section)
                {
                    if (inside_c)
                        overlap = 1;
                    inside_c = 1;
                    long t = tc;
                    tc = t + 3 * i;
                    inside_c = 0;
                }
                break;
            }
        }
        /* Nested critical sections of different names. */
#pragma omp critical(alpha)
        {
#pragma omp critical(beta)
            tb += 1;
            ta += 1;
        }
    }
    CHECK(!overlap, "critical: two threads inside at once");
    CHECK(total == (long)N * (N - 1) / 2, "critical sum");
    long ea = 0, eb = 0, ec = 0;
    for (int i = 0; i < N; i++) {
        if (i % 3 == 0)
            ea += i;
        else if (i % 3 == 1)
            eb += 2 * i;
        else
            ec += 3 * i;
    }
    /* ta and tb got one extra per thread: subtract via team size. */
    int team = 0;
#pragma omp parallel
#pragma omp single
    team = omp_get_num_threads();
    CHECK(ta - team == ea && tb - team == eb && tc == ec, "named critical sums");
    printf("critical: total=%ld a=%ld b=%ld c=%ld\n", total, ta - team, tb - team, tc);
}

static unsigned char seen_int[N], seen_long[N], seen_dbl[N];

static void atomics(void)
{
    int ix = 0, iy = 0, flag = 0;
    long lx = 0, ly = 1L << 40, lbits = 0;
    double dx = 0, dy = 0, dw = 0;
    memset(seen_int, 0, sizeof seen_int);
    memset(seen_long, 0, sizeof seen_long);
    memset(seen_dbl, 0, sizeof seen_dbl);
#pragma omp parallel
    {
#pragma omp for schedule(dynamic, 3)
        for (int i = 0; i < N; i++) {
            /* update */
#pragma omp atomic
            iy += 2;
#pragma omp atomic update
            ly -= 3;
#pragma omp atomic
            dy += 0.5;
#pragma omp atomic
            lbits |= 1L << (i % 48);
            /* capture: each old value is seen exactly once */
            int old_i;
#pragma omp atomic capture
            old_i = ix++;
            long old_l;
#pragma omp atomic capture
            {
                old_l = lx;
                lx += 1;
            }
            double old_d;
#pragma omp atomic capture
            {
                old_d = dx;
                dx = dx + 1.0;
            }
            if (old_i >= 0 && old_i < N)
                seen_int[old_i]++;
            if (old_l >= 0 && old_l < N)
                seen_long[old_l]++;
            if (old_d >= 0 && old_d < N)
                seen_dbl[(int)old_d]++;
            /* capture of the new value */
            double new_d;
#pragma omp atomic capture
            {
                dw += 0.25;
                new_d = dw;
            }
            CHECK(new_d >= 0.25 && new_d <= N * 0.25, "atomic capture of the new value");
        }
        /* write then read, across a barrier */
#pragma omp single
        {
#pragma omp atomic write
            flag = 42;
        }
        int f;
#pragma omp atomic read
        f = flag;
        CHECK(f == 42, "atomic write seen by atomic read");
        double dread;
#pragma omp atomic read
        dread = dy;
        CHECK(dread == N * 0.5, "atomic read of a double");
        long lread;
#pragma omp atomic read
        lread = ly;
        CHECK(lread == (1L << 40) - 3L * N, "atomic read of a long");
    }
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= seen_int[i] == 1 && seen_long[i] == 1 && seen_dbl[i] == 1;
    CHECK(ok, "atomic capture: each old value once");
    CHECK(ix == N && lx == N && dx == N && iy == 2 * N, "atomic capture totals");
    CHECK(lbits == (1L << 48) - 1, "atomic |=");
    CHECK(dw == N * 0.25, "atomic capture new-value total");
    printf("atomic: ix=%d iy=%d lx=%ld ly=%ld dx=%.2f dy=%.2f dw=%.2f bits=%lx\n",
           ix, iy, lx, ly, dx, dy, dw, lbits);
}

struct blob {
    int a;
    double b;
    char name[24];
    long big[4];
};

static void singles(void)
{
    int count[50];
    int nowait_count = 0;
    memset(count, 0, sizeof count);
    int cp_ok = 1;
#pragma omp parallel reduction(& : cp_ok)
    {
        for (int k = 0; k < 50; k++) {
#pragma omp single
            count[k]++;
        }
#pragma omp single nowait
        {
#pragma omp atomic
            nowait_count++;
        }
        /* copyprivate of scalars, a struct and a pointer */
        int v;
        double d;
        struct blob s;
        int *p;
        static int target = 77;
        for (int round = 0; round < 10; round++) {
#pragma omp single copyprivate(v, d, s, p)
            {
                v = 1000 + round;
                d = round * 0.5;
                s.a = -round;
                s.b = 3.25;
                strcpy(s.name, "copyprivate");
                for (int j = 0; j < 4; j++)
                    s.big[j] = (long)round << (8 * j);
                p = &target;
            }
            cp_ok &= v == 1000 + round && d == round * 0.5 && s.a == -round &&
                     s.b == 3.25 && strcmp(s.name, "copyprivate") == 0 &&
                     s.big[3] == (long)round << 24 && p == &target && *p == 77;
        }
    }
    int ok = 1;
    for (int k = 0; k < 50; k++)
        ok &= count[k] == 1;
    CHECK(ok, "single runs once");
    CHECK(nowait_count == 1, "single nowait runs once");
    CHECK(cp_ok, "single copyprivate broadcast");
    printf("single: ok\n");
}

static int slots[MAXT];

static void master_and_barriers(void)
{
    int master_runs = 0, master_thread = -1;
    int bad = 0;
#pragma omp parallel reduction(| : bad)
    {
#pragma omp master
        {
            master_runs++;
            master_thread = omp_get_thread_num();
        }
#pragma omp barrier
        bad |= master_runs != 1;
        int t = omp_get_thread_num();
        int n = omp_get_num_threads();
        for (int phase = 1; phase <= 30; phase++) {
            slots[t] = phase * 100 + t;
#pragma omp barrier
            int right = (t + 1) % n;
            if (slots[right] != phase * 100 + right)
                bad = 1;
#pragma omp barrier
        }
    }
    CHECK(master_runs == 1 && master_thread == 0, "master runs once on thread 0");
    CHECK(!bad, "barrier phases: neighbour's slot");
    printf("master, barrier: ok\n");
}

int main(void)
{
    critical_sections();
    atomics();
    singles();
    master_and_barriers();
    return finish();
}
