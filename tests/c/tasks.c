/* Explicit tasks: recursive fib with task/taskwait, taskgroup waiting for
 * nested descendants, taskyield, firstprivate data of several sizes
 * (structs and a variable-length array go through GOMP_task's cpyfn copy
 * function), if(0) undeferred tasks, final tasks and omp_in_final, tasks
 * created in single and in a work-shared loop. */
#include <omp.h>
#include <string.h>

#include "check.h"

#define FIB_N 20

static long fib(int n)
{
    if (n < 2)
        return n;
    long a, b;
#pragma omp task shared(a)
    a = fib(n - 1);
#pragma omp task shared(b)
    b = fib(n - 2);
#pragma omp taskwait
    return a + b;
}

static long fib_serial(int n)
{
    long a = 0, b = 1;
    for (int i = 0; i < n; i++) {
        long t = a + b;
        a = b;
        b = t;
    }
    return a;
}

static void fib_tasks(void)
{
    long r = -1;
#pragma omp parallel
#pragma omp single
    r = fib(FIB_N);
    CHECK(r == fib_serial(FIB_N), "fib with tasks");
    printf("fib(%d)=%ld\n", FIB_N, r);
}

static void spawn_tree(int depth, long *count)
{
#pragma omp atomic
    (*count)++;
    if (depth == 0)
        return;
    for (int k = 0; k < 3; k++) {
#pragma omp task firstprivate(depth)
        spawn_tree(depth - 1, count);
    }
    /* No taskwait: only the taskgroup waits for the descendants. */
}

static void taskgroups(void)
{
    long count = 0, after = -1;
    int yields_done = 0;
#pragma omp parallel
    {
#pragma omp single
        {
#pragma omp taskgroup
            {
                spawn_tree(5, &count);
            }
            /* 1 + 3 + 9 + 27 + 81 + 243 tasks, all finished here. */
#pragma omp atomic read
            after = count;
        }
        /* taskyield inside tasks and outside. */
#pragma omp for
        for (int i = 0; i < 40; i++) {
#pragma omp task
            {
#pragma omp taskyield
#pragma omp atomic
                yields_done++;
            }
#pragma omp taskyield
        }
    }
    CHECK(after == 364, "taskgroup waits for all descendants");
    CHECK(yields_done == 40, "tasks with taskyield");
    printf("taskgroup: %ld tasks; taskyield: %d\n", after, yields_done);
}

struct small {
    long v;
};
struct sixty_four {
    long words[8];
};
struct with_array {
    int n;
    int data[250];
    char tag[12];
};

static long results[8];

/* A task whose (implicitly firstprivate) struct is a parameter of the
 * creating function. GCC 12 passes every aggregate firstprivate of a task
 * through a copy function (GOMP_task's cpyfn); scalars are memcpy'd. */
static void task_on_param(struct sixty_four v, int slot)
{
#pragma omp task
    {
        long t = 0;
        for (int i = 0; i < 8; i++)
            t += v.words[i];
        results[slot] = t;
    }
    v.words[0] = -1000;
}

static void firstprivate_tasks(void)
{
    struct small s = {11};
    struct sixty_four b64;
    struct with_array wa;
    for (int i = 0; i < 8; i++)
        b64.words[i] = 100 + i;
    wa.n = 250;
    for (int i = 0; i < 250; i++)
        wa.data[i] = i;
    strcpy(wa.tag, "array");
    int n = 37;
    int vla[n];
    for (int i = 0; i < n; i++)
        vla[i] = 3 * i;
    memset(results, 0, sizeof results);
    char c = 'x';
    double d = 2.5;

#pragma omp parallel
#pragma omp single
    {
#pragma omp task firstprivate(s, c, d)
        results[0] = s.v + c + (long)(d * 2);
#pragma omp task firstprivate(b64)
        {
            long t = 0;
            for (int i = 0; i < 8; i++)
                t += b64.words[i];
            results[1] = t;
        }
#pragma omp task firstprivate(wa)
        {
            long t = 0;
            for (int i = 0; i < wa.n; i++)
                t += wa.data[i];
            results[2] = t + (strcmp(wa.tag, "array") == 0);
        }
#pragma omp task firstprivate(vla)
        {
            long t = 0;
            for (int i = 0; i < n; i++)
                t += vla[i];
            results[3] = t;
        }
        /* Locals of the creating block. */
        struct sixty_four local64;
        struct with_array local_wa;
        for (int i = 0; i < 8; i++)
            local64.words[i] = 1 << i;
        local_wa.n = 100;
        for (int i = 0; i < 100; i++)
            local_wa.data[i] = 2;
#pragma omp task firstprivate(local64, local_wa)
        {
            long t = 0;
            for (int i = 0; i < 8; i++)
                t += local64.words[i];
            for (int i = 0; i < local_wa.n; i++)
                t += local_wa.data[i];
            results[4] = t;
        }
        task_on_param(local64, 5);
        /* The creator changes its copies right away; the tasks must still
         * see the values at creation. */
        local64.words[0] = -1000;
        local_wa.data[0] = -1000;
        s.v = -1;
        b64.words[0] = -1000;
        wa.data[0] = -1000;
        vla[0] = -1000;
#pragma omp taskwait
    }
    CHECK(results[0] == 11 + 'x' + 5, "firstprivate scalars and small struct");
    CHECK(results[1] == 828, "firstprivate 64-byte struct");
    CHECK(results[2] == 250 * 249 / 2 + 1, "firstprivate struct with an array");
    CHECK(results[3] == 3 * 37 * 36 / 2, "firstprivate variable-length array");
    CHECK(results[4] == 255 + 200, "firstprivate structs local to the creator");
    CHECK(results[5] == 255, "firstprivate parameter struct");
    printf("firstprivate: %ld %ld %ld %ld %ld %ld\n", results[0], results[1],
           results[2], results[3], results[4], results[5]);
}

static void undeferred_and_final(void)
{
    int done_if0 = 0, ok_if0 = 1;
    int in_final_outside = -1, in_final_inside = -1, in_final_child = -1;
    long final_count = 0;
#pragma omp parallel
#pragma omp single
    {
        for (int i = 0; i < 20; i++) {
            /* Undeferred: finished before the creator goes on. */
#pragma omp task if (0) shared(done_if0)
            done_if0 = i + 1;
            ok_if0 &= done_if0 == i + 1;
        }
        in_final_outside = omp_in_final();
#pragma omp task final(1) shared(in_final_inside, in_final_child, final_count)
        {
            in_final_inside = omp_in_final();
            for (int k = 0; k < 10; k++) {
                /* Included tasks: run immediately by this thread. */
#pragma omp task shared(in_final_child, final_count)
                {
                    in_final_child = omp_in_final();
                    final_count++;
                }
            }
        }
#pragma omp taskwait
        /* final(0) is an ordinary task. */
        int nf = -1;
#pragma omp task final(0) shared(nf)
        nf = omp_in_final();
#pragma omp taskwait
        CHECK(nf == 0, "omp_in_final in a final(0) task");
    }
    CHECK(ok_if0 && done_if0 == 20, "if(0) tasks are undeferred");
    CHECK(in_final_outside == 0, "omp_in_final outside tasks");
    CHECK(in_final_inside == 1 && in_final_child == 1, "omp_in_final in final tasks");
    CHECK(final_count == 10, "tasks inside a final task");
    printf("if(0) and final: ok\n");
}

static void loop_tasks(void)
{
    static long cells[1000];
    long total = 0;
    memset(cells, 0, sizeof cells);
#pragma omp parallel
    {
        /* Every thread creates tasks for its iterations. */
#pragma omp for schedule(dynamic, 10)
        for (int i = 0; i < 1000; i++) {
#pragma omp task firstprivate(i)
            cells[i] = (long)i * i;
        }
        /* The loop's barrier completes the tasks. */
#pragma omp for reduction(+ : total)
        for (int i = 0; i < 1000; i++)
            total += cells[i];
        /* Tasks created by every thread, waited for with taskwait. */
        long mine = 0;
        for (int k = 0; k < 5; k++) {
#pragma omp task shared(mine) firstprivate(k)
            {
#pragma omp atomic
                mine += k;
            }
        }
#pragma omp taskwait
        CHECK(mine == 10, "taskwait for a thread's own tasks");
    }
    CHECK(total == 999L * 1000 * 1999 / 6, "tasks created in a loop");
    printf("loop tasks: %ld\n", total);
}

int main(void)
{
    fib_tasks();
    taskgroups();
    firstprivate_tasks();
    undeferred_and_final();
    loop_tasks();
    return finish();
}
