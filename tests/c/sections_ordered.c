/* sections (with lastprivate, firstprivate, reduction, nowait) and
 * parallel sections; ordered loops under several schedules, int and
 * unsigned long long, checked by recording the order of the ordered
 * blocks. */
#include <omp.h>
#include <string.h>

#include "check.h"

#define MAXN 3000

static int ran[8];

static void sections(void)
{
    int last = -1, seed = 5;
    long red = 0;
    memset(ran, 0, sizeof ran);
#pragma omp parallel
    {
#pragma omp sections lastprivate(last) firstprivate(seed) reduction(+ : red)
        {
#pragma omp section
            {
                ran[0]++;
                last = seed * 1;
                red += 1;
            }
#pragma omp section
            {
                ran[1]++;
                last = seed * 2;
                red += 10;
            }
#pragma omp section
            {
                ran[2]++;
                last = seed * 3;
                red += 100;
            }
#pragma omp section
            {
                ran[3]++;
                last = seed * 4 + 1;
                red += 1000;
            }
        }
#pragma omp sections nowait
        {
#pragma omp section
            ran[4]++;
#pragma omp section
            ran[5]++;
        }
    }
    int ok = 1;
    for (int k = 0; k < 6; k++)
        ok &= ran[k] == 1;
    CHECK(ok, "each section runs once");
    CHECK(last == 21, "sections lastprivate comes from the last section");
    CHECK(red == 1111, "sections reduction");
    printf("sections: last=%d red=%ld\n", last, red);

    int a = 0, b = 0, c = 0, plast = 0;
#pragma omp parallel sections lastprivate(plast)
    {
#pragma omp section
        {
            a = 1;
            plast = 10;
        }
#pragma omp section
        {
            b = 2;
            plast = 20;
        }
#pragma omp section
        {
            c = 3;
            plast = 30;
        }
    }
    CHECK(a == 1 && b == 2 && c == 3 && plast == 30, "parallel sections");
    printf("parallel sections: a=%d b=%d c=%d last=%d\n", a, b, c, plast);

    /* Many sections in a loop: each round's sections all run once. */
    int rounds_ok = 1;
    for (int round = 0; round < 20; round++) {
        int s0 = 0, s1 = 0, s2 = 0;
#pragma omp parallel sections
        {
#pragma omp section
            s0 = round;
#pragma omp section
            s1 = round + 1;
#pragma omp section
            s2 = round + 2;
        }
        rounds_ok &= s0 == round && s1 == round + 1 && s2 == round + 2;
    }
    CHECK(rounds_ok, "parallel sections in a loop");
}

static long order[MAXN];
static int pos;

static void check_order(const char *label, int n, long first, long step)
{
    int ok = pos == n;
    for (int k = 0; k < n && k < pos; k++)
        ok &= order[k] == first + k * step;
    CHECK(ok, label);
    long sum = 0;
    for (int k = 0; k < pos; k++)
        sum += order[k];
    printf("%s: n=%d sum=%ld\n", label, pos, sum);
}

#define PRAGMA(x) _Pragma(#x)
#define ORDERED_LOOP(label, lb, ub, st, ...)                                \
    do {                                                                    \
        pos = 0;                                                            \
        long work = 0;                                                      \
        PRAGMA(omp parallel reduction(+ : work))                            \
        {                                                                   \
            PRAGMA(omp for ordered __VA_ARGS__)                             \
            for (int i = (lb); i < (ub); i += (st)) {                       \
                work += (long)i * i; /* unordered part */                   \
                PRAGMA(omp ordered)                                         \
                order[pos++] = i;                                           \
            }                                                               \
        }                                                                   \
        check_order(label, ((ub) - (lb) + (st) - 1) / (st), lb, st);        \
        long expect = 0;                                                    \
        for (int i = (lb); i < (ub); i += (st))                             \
            expect += (long)i * i;                                          \
        CHECK(work == expect, "ordered loop's unordered part");             \
    } while (0)

static void ordered_loops(void)
{
    ORDERED_LOOP("ordered static", 0, 1000, 1, schedule(static));
    ORDERED_LOOP("ordered static,1", 0, 1000, 1, schedule(static, 1));
    ORDERED_LOOP("ordered static,4", 5, 2005, 2, schedule(static, 4));
    ORDERED_LOOP("ordered dynamic", 0, 1000, 1, schedule(dynamic));
    ORDERED_LOOP("ordered dynamic,3", 0, 1000, 3, schedule(dynamic, 3));
    ORDERED_LOOP("ordered guided", 0, 1000, 1, schedule(guided));
    ORDERED_LOOP("ordered guided,2", 0, 1000, 1, schedule(guided, 2));
    ORDERED_LOOP("ordered runtime", 0, 1000, 1, schedule(runtime));
    ORDERED_LOOP("ordered default", 0, 500, 1, );

    /* Combined parallel for ordered. */
    pos = 0;
#pragma omp parallel for ordered schedule(dynamic, 2)
    for (int i = 0; i < 700; i++) {
#pragma omp ordered
        order[pos++] = i;
    }
    check_order("parallel for ordered dynamic,2", 700, 0, 1);

    /* Decreasing unsigned long long induction. */
    pos = 0;
#pragma omp parallel
    {
#pragma omp for ordered schedule(dynamic, 5)
        for (unsigned long long u = 0xF000000000000000ULL + 2000;
             u > 0xF000000000000000ULL; u -= 2) {
#pragma omp ordered
            order[pos++] = (long)(u - 0xF000000000000000ULL);
        }
#pragma omp for ordered schedule(static, 3)
        for (unsigned long long u = 1ULL << 63; u < (1ULL << 63) + 500; u++) {
#pragma omp ordered
            order[pos++] = 2000 + (long)(u - (1ULL << 63));
        }
    }
    int ok = pos == 1500;
    for (int k = 0; k < 1000 && ok; k++)
        ok &= order[k] == 2000 - 2 * k;
    for (int k = 0; k < 500 && ok; k++)
        ok &= order[1000 + k] == 2000 + k;
    CHECK(ok, "ordered ull loops");
    printf("ordered ull: n=%d\n", pos);

    /* An ordered loop in which some iterations skip the ordered block. */
    pos = 0;
#pragma omp parallel for ordered schedule(static, 2)
    for (int i = 0; i < 600; i++) {
        if (i % 3 != 0) {
#pragma omp ordered
            order[pos++] = i;
        }
    }
    ok = pos == 400;
    for (int k = 1; k < pos; k++)
        ok &= order[k] > order[k - 1];
    CHECK(ok, "ordered loop with skipped ordered blocks");
    printf("ordered skipping: n=%d\n", pos);
}

int main(void)
{
    sections();
    ordered_loops();
    return finish();
}
