/*
 * whale_safetensors.h — read and write Hugging Face .safetensors files.
 *
 * Reading maps each file read-only and hands out pointers into the mapping
 * (zero-copy). Every header is validated strictly: the JSON must be an
 * object of well-formed entries whose byte ranges tile the data area exactly
 * (no overlaps, holes or trailing bytes), so a tensor's data pointer and
 * nbytes can be trusted without further checks.
 *
 * Data is little-endian and row-major, as stored. Pointers are only as
 * aligned as the file makes them: whale_st_write pads the header so the data
 * area starts 8-byte aligned, but files from other writers, or a tensor that
 * follows one whose size is not a multiple of 8, may be unaligned.
 */
#ifndef WHALE_SAFETENSORS_H
#define WHALE_SAFETENSORS_H

#include "whale.h"

#include <stddef.h>
#include <stdint.h>

/* safetensors' own cap on the JSON header (MAX_HEADER_SIZE). */
#define WHALE_ST_MAX_HEADER 100000000u

typedef struct {
    const char *name; /* tensor name */
    whale_dtype dtype;
    int ndim;
    int64_t shape[WHALE_MAX_DIMS];
    const void *data; /* points into the mmapped file (zero-copy) */
    size_t nbytes;
    const char *file; /* path of the file that holds it */
} whale_st_entry;

/* A set of tensors, from one file or a sharded checkpoint. */
typedef struct whale_st whale_st;

/* One .safetensors file, mmapped read-only. */
whale_code whale_st_open(const char *path, whale_st **out, whale_err *err);

/* A model directory: DIR/model.safetensors if it exists, else
 * DIR/model.safetensors.index.json, whose weight_map names the shard of every
 * tensor. Each shard is opened once; every tensor the index lists must be in
 * its shard and a shard must hold no tensor the index does not list for it.
 * Shard names must be plain file names inside DIR. Shards are read in name
 * order. Error (WHALE_ERR_IO) if neither file exists. */
whale_code whale_st_open_dir(const char *dir, whale_st **out, whale_err *err);

int whale_st_count(const whale_st *st);
/* Entries in file order: shard by shard, each by data offset. NULL if i is
 * out of range. */
const whale_st_entry *whale_st_at(const whale_st *st, int i);
/* Lookup by name through a hash table; NULL if absent. */
const whale_st_entry *whale_st_find(const whale_st *st, const char *name);
/* __metadata__ value for key, or NULL. For a sharded checkpoint the first
 * shard (in name order) that has the key wins. */
const char *whale_st_metadata(const whale_st *st, const char *key);
void whale_st_close(whale_st *st);
/* Whether p points into one of the mapped files. */
int whale_st_holds(const whale_st *st, const void *p);
/* Drop the resident pages of the mappings (data is read again from the
 * files on the next access): after converting tensors into other memory. */
void whale_st_release_pages(whale_st *st);

typedef struct {
    const char *name;
    whale_dtype dtype;
    int ndim;
    const int64_t *shape; /* may be NULL when ndim is 0 */
    const void *data;     /* may be NULL when the tensor has no elements */
} whale_st_item;

/* Write one file: 8-byte little-endian header length, then a JSON header
 * starting with "__metadata__":{"format":"pt"} (plus the extra key/value
 * pairs in meta, which may be NULL and is terminated by a NULL key; "format"
 * itself is reserved), padded with spaces to a multiple of 8 bytes so the
 * data area is 8-byte aligned, then the tensors back to back in the order
 * given. The file is written to path.tmp, fsynced and renamed, so no partial
 * file is left behind on failure. Bad items (duplicate or invalid names,
 * unknown dtype, bad shape, missing data) fail with WHALE_ERR_ARG before
 * anything is created. */
whale_code whale_st_write(const char *path, const whale_st_item *items, int n,
                          const char *const *meta, whale_err *err);

/* The same, with tensor i's bytes from produce(user, i, err), called once
 * per tensor in order (items[i].data is ignored): a pointer to sizes' worth
 * of bytes, valid until the next call, or NULL with err set. For files
 * larger than memory (a model initialised tensor by tensor). */
typedef const void *(*whale_st_producer)(void *user, int i, whale_err *err);
whale_code whale_st_write_stream(const char *path, const whale_st_item *items, int n, const char *const *meta,
                                 whale_st_producer produce, void *user, whale_err *err);

#endif
