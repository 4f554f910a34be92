/* Reductions: + * max min && || & | ^ on int, long, float, double, short
 * and unsigned char (values exactly representable, so every result is
 * exact), on loops, on regions,
 * on combined constructs, several variables in one clause, array sections
 * and a user-defined reduction. */
#include <limits.h>
#include <omp.h>

#include "check.h"

#define N 3000

static double factor(int i)
{
    /* Powers of two: every product is exact whatever the order. */
    switch (i % 4) {
    case 0: return 2.0;
    case 1: return 0.5;
    case 2: return 1.0;
    default: return i % 16 == 3 ? 2.0 : 1.0;
    }
}

struct minmax {
    long lo, hi;
};

#pragma omp declare reduction(mm : struct minmax :                            \
        omp_out.lo = omp_in.lo < omp_out.lo ? omp_in.lo : omp_out.lo,          \
        omp_out.hi = omp_in.hi > omp_out.hi ? omp_in.hi : omp_out.hi)          \
    initializer(omp_priv = (struct minmax){LONG_MAX, LONG_MIN})

int main(void)
{
    /* int */
    int isum = 0, iprod = 1, imax = INT_MIN, imin = INT_MAX, iand = 1, ior = 0;
    int ibor = 0, iband = ~0, ixor = 0;
#pragma omp parallel for reduction(+ : isum) reduction(* : iprod)             \
    reduction(max : imax) reduction(min : imin) reduction(&& : iand)          \
    reduction(|| : ior) reduction(| : ibor) reduction(& : iband)              \
    reduction(^ : ixor) schedule(dynamic, 17)
    for (int i = 0; i < N; i++) {
        isum += i;
        iprod *= (i % 250 == 0) ? 2 : 1;      /* 2^12 */
        imax = imax > (i * 7) % 1009 ? imax : (i * 7) % 1009;
        imin = imin < (i * 7) % 1009 - 5 ? imin : (i * 7) % 1009 - 5;
        iand = iand && (i >= 0);
        ior = ior || (i == 1234);
        ibor |= 1 << (i % 20);
        iband &= ~(1 << (i % 7 + 20)) | (i < 2900 ? ~0 : 0);
        ixor ^= i;
    }
    CHECK(isum == N * (N - 1) / 2, "int +");
    CHECK(iprod == 4096, "int *");
    CHECK(imax == 1008 && imin == -5, "int max/min");
    CHECK(iand == 1 && ior == 1, "int && ||");
    CHECK(ibor == (1 << 20) - 1, "int |");
    printf("int: sum=%d prod=%d max=%d min=%d and=%d or=%d bor=%d band=%d xor=%d\n",
           isum, iprod, imax, imin, iand, ior, ibor, iband, ixor);

    /* long, in a region with a work-shared loop inside. */
    long lsum = 0, lprod = 1, lmax = LONG_MIN, lmin = LONG_MAX, land = 1, lor = 0;
    long lbor = 0;
#pragma omp parallel
    {
#pragma omp for reduction(+ : lsum) reduction(* : lprod) reduction(max : lmax) \
    reduction(min : lmin) schedule(guided)
        for (long i = 0; i < N; i++) {
            lsum += i * 1000000007L;
            lprod *= (i % 75 == 0) ? 2 : 1; /* 2^40 */
            if (i * 31 % 2999 > lmax)
                lmax = i * 31 % 2999;
            if (-i * 1000000000L < lmin)
                lmin = -i * 1000000000L;
        }
#pragma omp for reduction(&& : land) reduction(|| : lor) reduction(| : lbor) nowait
        for (long i = 0; i < 64; i++) {
            land = land && (i != 70);
            lor = lor || (i == 63);
            lbor |= 1L << i;
        }
    }
    CHECK(lsum == (long)N * (N - 1) / 2 * 1000000007L, "long +");
    CHECK(lprod == 1L << 40, "long *");
    CHECK(lmax == 2998 && lmin == -(long)(N - 1) * 1000000000L, "long max/min");
    CHECK(land == 1 && lor == 1 && lbor == -1L, "long && || |");
    printf("long: sum=%ld prod=%ld max=%ld min=%ld and=%ld or=%ld bor=%lx\n", lsum,
           lprod, lmax, lmin, land, lor, lbor);

    /* double: sums of small integers and halves, products of powers of
     * two, max and min, && on doubles. */
    double dsum = 0, dprod = 1, dmax = -1e300, dmin = 1e300;
    int dand = 1;
#pragma omp parallel for reduction(+ : dsum) reduction(* : dprod)             \
    reduction(max : dmax) reduction(min : dmin) reduction(&& : dand)           \
    schedule(static, 5)
    for (int i = 0; i < N; i++) {
        dsum += i * 0.5;
        dprod *= factor(i);
        dmax = dmax > i * 0.25 ? dmax : i * 0.25;
        dmin = dmin < 10.0 - i * 0.125 ? dmin : 10.0 - i * 0.125;
        dand = dand && (i * 0.5 >= 0.0);
    }
    double expect_prod = 1;
    for (int i = 0; i < N; i++)
        expect_prod *= factor(i);
    CHECK(dsum == (double)N * (N - 1) / 4, "double +");
    CHECK(dprod == expect_prod, "double *");
    CHECK(dmax == (N - 1) * 0.25 && dmin == 10.0 - (N - 1) * 0.125, "double max/min");
    CHECK(dand == 1, "double &&");
    printf("double: sum=%.3f prod=%a max=%.3f min=%.3f and=%d\n", dsum, dprod,
           dmax, dmin, dand);

    /* float (a `lock cmpxchg` loop on 4 bytes): sums of quarters, products
     * of powers of two, max, min, || on floats — all exact. */
    float fsum = 0, fprod = 1, fmaxv = -1e30f, fminv = 1e30f;
    int f_or = 0;
    short ssum = 0;
    unsigned char cxor = 0;
#pragma omp parallel for reduction(+ : fsum) reduction(* : fprod)              \
    reduction(max : fmaxv) reduction(min : fminv) reduction(|| : f_or)         \
    reduction(+ : ssum) reduction(^ : cxor) schedule(dynamic, 7)
    for (int i = 0; i < N; i++) {
        fsum += (i % 64) * 0.25f;
        fprod *= (i % 500 == 0) ? 2.0f : (i % 500 == 250 ? 0.5f : 1.0f);
        fmaxv = fmaxv > i * 0.5f ? fmaxv : i * 0.5f;
        fminv = fminv < 3.0f - i * 0.25f ? fminv : 3.0f - i * 0.25f;
        f_or = f_or || (i * 0.5f == 1000.0f);
        ssum += (short)(i % 5);
        cxor ^= (unsigned char)(i * 37);
    }
    float fexpect = 0;
    for (int i = 0; i < N; i++)
        fexpect += (i % 64) * 0.25f;
    unsigned char cexpect = 0;
    for (int i = 0; i < N; i++)
        cexpect ^= (unsigned char)(i * 37);
    CHECK(fsum == fexpect, "float +");
    CHECK(fprod == 1.0f, "float *");
    CHECK(fmaxv == (N - 1) * 0.5f && fminv == 3.0f - (N - 1) * 0.25f, "float max/min");
    CHECK(f_or == 1, "float ||");
    CHECK(ssum == (short)(N / 5 * 10), "short +");
    CHECK(cxor == cexpect, "unsigned char ^");
    printf("float: sum=%.2f prod=%a max=%.2f min=%.2f or=%d short=%d char=%u\n", fsum,
           fprod, fmaxv, fminv, f_or, ssum, cxor);

    /* One variable per clause and loop: GCC merges each with a locked
     * instruction on the shared variable (`lock cmpxchg` on 4 bytes for a
     * float, on 2 for a short, `lock xor` on a byte). */
    float fone = 0;
#pragma omp parallel for reduction(+ : fone)
    for (int i = 0; i < N; i++)
        fone += 0.5f;
    short sone = 0;
#pragma omp parallel for reduction(max : sone)
    for (int i = 0; i < N; i++)
        sone = sone > (short)(i % 1000) ? sone : (short)(i % 1000);
    unsigned char cone = 0;
#pragma omp parallel for reduction(^ : cone)
    for (int i = 0; i < N; i++)
        cone ^= (unsigned char)(i * 37);
    CHECK(fone == N * 0.5f, "float + alone");
    CHECK(sone == 999, "short max alone");
    CHECK(cone == cexpect, "unsigned char ^ alone");
    printf("alone: %.1f %d %u\n", fone, sone, cone);

    /* Region-level reductions: every thread contributes once. */
    int members = 0;
    long tid_sum = 0;
    double half_sum = 0;
    int team = 0;
#pragma omp parallel reduction(+ : members, tid_sum, half_sum)
    {
        members += 1;
        tid_sum += omp_get_thread_num();
        half_sum += 0.5;
#pragma omp single
        team = omp_get_num_threads();
    }
    CHECK(members == team, "parallel reduction(+) counts the team");
    CHECK(tid_sum == (long)team * (team - 1) / 2, "parallel reduction of thread numbers");
    CHECK(half_sum == team * 0.5, "parallel reduction of a double");
    printf("region: ok\n");

    /* Array section reduction. */
    long hist[8] = {0};
#pragma omp parallel for reduction(+ : hist[:8]) schedule(dynamic, 11)
    for (int i = 0; i < N; i++)
        hist[i % 8] += i;
    long htotal = 0;
    for (int k = 0; k < 8; k++)
        htotal += hist[k];
    CHECK(htotal == (long)N * (N - 1) / 2, "array section reduction");
    printf("hist: %ld %ld %ld %ld %ld %ld %ld %ld\n", hist[0], hist[1], hist[2],
           hist[3], hist[4], hist[5], hist[6], hist[7]);

    /* User-defined reduction on a struct. */
    struct minmax mm = {LONG_MAX, LONG_MIN};
#pragma omp parallel for reduction(mm : mm) schedule(guided, 7)
    for (int i = 0; i < N; i++) {
        long v = (long)(i * 7919L % 4001) - 2000;
        if (v < mm.lo)
            mm.lo = v;
        if (v > mm.hi)
            mm.hi = v;
    }
    CHECK(mm.lo == -2000 && mm.hi <= 2000, "user-defined reduction");
    printf("udr: lo=%ld hi=%ld\n", mm.lo, mm.hi);

    /* Reductions in several consecutive loops of one region, nowait. */
    long a = 0, b = 0;
#pragma omp parallel
    {
#pragma omp for reduction(+ : a) nowait
        for (int i = 0; i < 1000; i++)
            a += i;
#pragma omp for reduction(+ : b) schedule(dynamic)
        for (int i = 0; i < 1000; i++)
            b += 2 * i;
    }
    CHECK(a == 499500 && b == 999000, "reductions with nowait");
    printf("nowait: a=%ld b=%ld\n", a, b);
    return finish();
}
