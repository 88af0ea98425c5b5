/* Element types as safetensors names them. */
#include "whale.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_info[WHALE_DTYPE_COUNT] = {
    [WHALE_F32] = {"F32", 4}, [WHALE_F16] = {"F16", 2}, [WHALE_BF16] = {"BF16", 2},
    [WHALE_I8] = {"I8", 1},   [WHALE_U8] = {"U8", 1},   [WHALE_I32] = {"I32", 4},
    [WHALE_I64] = {"I64", 8},
};

size_t whale_dtype_size(whale_dtype dt) {
    return (unsigned)dt < WHALE_DTYPE_COUNT ? dtype_info[dt].size : 0;
}

const char *whale_dtype_name(whale_dtype dt) {
    return (unsigned)dt < WHALE_DTYPE_COUNT ? dtype_info[dt].name : "?";
}

const char *whale_dtype_torch_name(whale_dtype dt) {
    switch (dt) {
    case WHALE_F32: return "float32";
    case WHALE_BF16: return "bfloat16";
    case WHALE_F16: return "float16";
    case WHALE_I8: return "int8";
    default: return whale_dtype_name(dt);
    }
}

int whale_dtype_from_name(const char *name, whale_dtype *dt) {
    for (int i = 0; i < WHALE_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_info[i].name) == 0) {
            *dt = (whale_dtype)i;
            return 0;
        }
    return -1;
}

int64_t whale_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}
