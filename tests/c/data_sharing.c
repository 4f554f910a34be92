/* Data shared with team threads: main's locals (scalars, an array, a
 * struct) read in regions and written through pointers, global arrays
 * (initialised .data and zero .bss), and heap memory from malloc, calloc,
 * realloc and posix_memalign, allocated by main and by team threads. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define N 1000

struct point {
    long x;
    double y;
    int tag[6];
};

/* Initialised globals (.data) and zero-initialised globals (.bss). */
static int g_data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static double g_scale = 2.5;
static long g_bss[N];
static int g_bss_flags[64];
int g_counter_extern;

static void bump_through(long *p, long by)
{
#pragma omp atomic
    *p += by;
}

int main(void)
{
    /* main's locals, shared with the team (main's stack). */
    int local_scalar = 7;
    double local_double = 0.25;
    long local_sum = 0;
    int local_array[64];
    struct point pt = {.x = 40, .y = 1.5, .tag = {1, 1, 2, 3, 5, 8}};
    long written_by_ptr[8];
    int *ptr_to_local = &local_scalar;

    for (int i = 0; i < 64; i++)
        local_array[i] = i * 3;
    memset(written_by_ptr, 0, sizeof written_by_ptr);

    /* Reads of main's locals and writes through pointers to them. */
#pragma omp parallel shared(local_scalar, local_double, local_array, pt)
    {
        long mine = 0;
        CHECK(*ptr_to_local == 7, "pointer to main's int read in region");
        CHECK(local_double == 0.25, "main's double read in region");
        CHECK(pt.x == 40 && pt.y == 1.5 && pt.tag[5] == 8,
              "main's struct read in region");
#pragma omp for
        for (int i = 0; i < 64; i++)
            mine += local_array[i];
        bump_through(&local_sum, mine);
#pragma omp for
        for (int i = 0; i < 8; i++)
            written_by_ptr[i] = (long)i * pt.x;
#pragma omp single
        {
            pt.x = 41;
            pt.tag[0] = 100;
            *ptr_to_local = 8;
        }
        /* single's barrier: every thread sees the writes. */
        CHECK(pt.x == 41 && pt.tag[0] == 100 && local_scalar == 8,
              "writes of single seen by the team");
    }
    CHECK(local_sum == 3 * 63 * 64 / 2, "sum of main's array");
    for (int i = 0; i < 8; i++)
        CHECK(written_by_ptr[i] == (long)i * 40, "main's array written in region");
    printf("locals: sum=%ld pt.x=%ld scalar=%d\n", local_sum, pt.x, local_scalar);

    /* Globals: .data read, .bss written, then read back by other threads. */
    long gsum = 0;
#pragma omp parallel
    {
#pragma omp for reduction(+ : gsum)
        for (int i = 0; i < 16; i++)
            gsum += g_data[i];
#pragma omp for schedule(static, 7)
        for (int i = 0; i < N; i++)
            g_bss[i] = (long)(i * g_scale * 2); /* exact: i * 5 */
        /* The implicit barrier of the loop above orders these reads. */
#pragma omp for schedule(static, 13)
        for (int i = 0; i < N; i++)
            CHECK(g_bss[i] == 5L * i, "global .bss array written by another thread");
        g_bss_flags[omp_get_thread_num()] = 1;
#pragma omp atomic
        g_counter_extern += 1;
#pragma omp single
        g_data[0] = 1000;
        CHECK(g_data[0] == 1000, "global .data written in single");
    }
    int flags = 0;
    for (int i = 0; i < 64; i++)
        flags += g_bss_flags[i];
    CHECK(flags == g_counter_extern, "one .bss flag per thread");
    CHECK(gsum == 136, "sum of .data array");
    printf("globals: sum=%ld last=%ld\n", gsum, g_bss[N - 1]);

    /* A team thread's own locals, read by the others after a barrier and
     * after the barrier that ends a loop: the frame just above the
     * runtime's entry point is the program's and must be published. */
    long *frames[64];
#pragma omp parallel
    {
        long own[4];
        int me = omp_get_thread_num(), nt = omp_get_num_threads();
        frames[me] = own;
        for (int round = 0; round < 3; round++) {
            for (int k = 0; k < 4; k++)
                own[k] = 1000 * round + 10 * me + k;
            if (round % 2 == 0) {
#pragma omp barrier
            } else {
#pragma omp for schedule(dynamic)
                for (int i = 0; i < nt; i++)
                    (void)i;
            }
            int next = (me + 1) % nt;
            for (int k = 0; k < 4; k++)
                CHECK(frames[next][k] == 1000 * round + 10 * next + k,
                      "a team thread's frame read by another after a barrier");
#pragma omp barrier
        }
    }
    printf("frames: ok\n");

    /* Heap memory allocated by main, used by the team. */
    int *m = malloc(N * sizeof *m);
    long *c = calloc(N, sizeof *c);
    double *r = malloc(10 * sizeof *r);
    void *aligned = NULL;
    CHECK(m && c && r, "main's allocations");
    CHECK(posix_memalign(&aligned, 64, 4096) == 0, "posix_memalign in main");
    CHECK(((uintptr_t)aligned & 63) == 0, "posix_memalign alignment");
    for (int i = 0; i < 10; i++)
        r[i] = i;
    r = realloc(r, N * sizeof *r); /* grows; first 10 kept */
    CHECK(r != NULL, "realloc in main");
    for (int i = 10; i < N; i++)
        r[i] = i;
    unsigned char *al = aligned;
#pragma omp parallel for schedule(dynamic, 32)
    for (int i = 0; i < N; i++) {
        CHECK(c[i] == 0, "calloc memory is zero in region");
        m[i] = 2 * i;
        c[i] = (long)r[i] + 1;
    }
#pragma omp parallel for schedule(guided)
    for (int i = 0; i < 4096 / 4; i++)
        memset(al + 4 * i, i & 0xff, 4);
    long heap_sum = 0;
    for (int i = 0; i < N; i++)
        heap_sum += m[i] + c[i];
    for (int i = 0; i < 4096; i++)
        CHECK(al[i] == ((i / 4) & 0xff), "posix_memalign memory written in region");
    printf("heap(main): sum=%ld\n", heap_sum);

    /* Heap memory allocated and freed by team threads; one thread's buffer
     * outlives the region and main frees it. */
    long *escaped = NULL;
    long scratch_total = 0;
#pragma omp parallel reduction(+ : scratch_total)
    {
        int t = omp_get_thread_num();
        int n = 100 + 37 * t;
        long *s = malloc(n * sizeof *s);
        int *z = calloc(n, sizeof *z);
        CHECK(s && z, "allocations in team threads");
        for (int i = 0; i < n; i++) {
            CHECK(z[i] == 0, "calloc in team thread is zero");
            s[i] = i;
        }
        s = realloc(s, 2 * n * sizeof *s);
        CHECK(s != NULL, "realloc in team thread");
        for (int i = n; i < 2 * n; i++)
            s[i] = i;
        void *pa = NULL;
        CHECK(posix_memalign(&pa, 256, 1000) == 0 && ((uintptr_t)pa & 255) == 0,
              "posix_memalign in team thread");
        memset(pa, t, 1000);
        free(pa);
        free(z);
        /* Per-thread work is team-size dependent; count it in a way that
         * is not: each thread checks its own buffer. */
        long part = 0;
        for (int i = 0; i < 2 * n; i++)
            part += s[i];
        CHECK(part == (long)(2 * n) * (2 * n - 1) / 2, "team thread's buffer");
        free(s);
#pragma omp for
        for (int i = 0; i < 100; i++)
            scratch_total += i;
#pragma omp single
        {
            escaped = malloc(N * sizeof *escaped);
            for (int i = 0; i < N; i++)
                escaped[i] = 3 * i;
        }
    }
    long esc_sum = 0;
    for (int i = 0; i < N; i++)
        esc_sum += escaped[i];
    free(escaped);
    free(m);
    free(c);
    free(r);
    free(aligned);
    printf("heap(team): total=%ld escaped=%ld\n", scratch_total, esc_sum);
    return finish();
}
