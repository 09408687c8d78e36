#include "dtype.h"

#include <string.h>

static const struct {
    duet_dtype_t dt;
    const char *st;
    const char *name;
    size_t size;
} dtype_table[] = {
    {DUET_DT_F32, "F32", "f32", 4},
    {DUET_DT_F16, "F16", "f16", 2},
    {DUET_DT_BF16, "BF16", "bf16", 2},
    {DUET_DT_F8_E4M3, "F8_E4M3", "fp8_e4m3", 1},
    {DUET_DT_F8_E8M0, "F8_E8M0", "ue8m0", 1},
    {DUET_DT_F4_E2M1X2, "F4", "fp4_e2m1x2", 1},
    {DUET_DT_I8, "I8", "i8", 1},
    {DUET_DT_U8, "U8", "u8", 1},
    {DUET_DT_I16, "I16", "i16", 2},
    {DUET_DT_I32, "I32", "i32", 4},
    {DUET_DT_I64, "I64", "i64", 8},
    {DUET_DT_BOOL, "BOOL", "bool", 1},
};

#define N_DTYPES (sizeof dtype_table / sizeof dtype_table[0])

duet_dtype_t duet_dtype_from_st_name(const char *name)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(dtype_table[i].st, name) == 0)
            return dtype_table[i].dt;
    return DUET_DT_INVALID;
}

const char *duet_dtype_st_name(duet_dtype_t dt)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dt == dt)
            return dtype_table[i].st;
    return "INVALID";
}

const char *duet_dtype_name(duet_dtype_t dt)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dt == dt)
            return dtype_table[i].name;
    return "invalid";
}

size_t duet_dtype_size(duet_dtype_t dt)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtype_table[i].dt == dt)
            return dtype_table[i].size;
    return 0;
}
