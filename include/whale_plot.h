/* Training curves as SVG line charts (whale plot): one or more runs'
 * metrics.jsonl overlaid in one chart, written without a plotting library. */
#ifndef WHALE_PLOT_H
#define WHALE_PLOT_H

#include "whale.h"

#include <stddef.h>

typedef struct {
    /* Chart title; NULL or "" for none. */
    const char *title;
    /* Key to plot. NULL or "loss": train "loss" (thin line plus a moving
     * average) and "val_loss" (markers and a dashed line) of each run.
     * "val_*" keys are drawn like val_loss, any other key like train loss. */
    const char *metric;
    /* Logarithmic y axis; values <= 0 are then left out (gaps). */
    int log_y;
    /* Moving-average window (points) drawn over train-style lines:
     * 0 = automatic (about 2% of the points, train loss only), 1 = none. */
    int smooth;
    /* Canvas size in pixels; 0 = 900 x 540. */
    int width, height;
} whale_plot_opts;

/* Each input is a run folder (holding metrics.jsonl) or a .jsonl file; its
 * name in the legend is the folder name or the file stem. Lines are JSON
 * objects; those without the plotted keys (e.g. {"event": ...}) are skipped,
 * a line that is not a JSON object is an error naming file:line (except an
 * unterminated last line, which a running trainer may be writing). NaN,
 * Infinity and null values leave a gap. opts may be NULL (defaults).
 * whale_plot_render returns the SVG text (malloc'd, NUL-terminated);
 * whale_plot_svg writes it to out_path atomically. */
whale_code whale_plot_render(const char *const *inputs, int n, const whale_plot_opts *opts, char **svg,
                             size_t *len, whale_err *err);
whale_code whale_plot_svg(const char *const *inputs, int n, const whale_plot_opts *opts, const char *out_path,
                          whale_err *err);

#endif
