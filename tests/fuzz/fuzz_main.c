/* Stand-alone driver for the fuzz targets when they are built without
 * libFuzzer: runs LLVMFuzzerTestOneInput once on every regular file named on
 * the command line or found (one level deep) in a directory named there, and
 * prints how many inputs ran.  Exits 1 when a path cannot be read or nothing
 * ran, so a missing corpus fails the test.  Built with -DDUET_FUZZ_LIBFUZZER
 * (libFuzzer supplies main) this file is empty. */
#ifndef DUET_FUZZ_LIBFUZZER

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Run one file; returns 0 on success, -1 when it cannot be read. */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long len;
    int rc = -1;

    if (!f)
        goto err_msg;
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto err_close;
    /* exact size so that sanitizers see reads past the input */
    if (!(buf = malloc(len ? (size_t)len : 1)) || fread(buf, 1, (size_t)len, f) != (size_t)len)
        goto err_close;
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    rc = 0;
err_close:
    free(buf);
    fclose(f);
err_msg:
    if (rc)
        fprintf(stderr, "fuzz: cannot read %s\n", path);
    return rc;
}

int main(int argc, char **argv)
{
    size_t ran = 0;
    int failed = 0;
    char path[4096];
    struct stat sb;

    for (int i = 1; i < argc; i++) {
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "fuzz: cannot stat %s\n", argv[i]);
            failed = 1;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]) == 0)
                ran++;
            else
                failed = 1;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        if (!d) {
            fprintf(stderr, "fuzz: cannot open directory %s\n", argv[i]);
            failed = 1;
            continue;
        }
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
            if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
                continue;
            if (run_file(path) == 0)
                ran++;
            else
                failed = 1;
        }
        closedir(d);
    }
    printf("fuzz: ran %zu inputs\n", ran);
    return failed || ran == 0;
}

#else
typedef int duet_fuzz_main_unused_t; /* ISO C forbids an empty translation unit */
#endif
