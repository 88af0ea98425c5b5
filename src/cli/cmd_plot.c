/* whale plot: training curves of one or more runs as an SVG chart */
#include "cli.h"

#include "whale_plot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char plot_help[] =
    "usage: whale plot RUN_OR_JSONL... --out FILE.svg [--title T] [--metric KEY] [--log-y]\n"
    "                  [--smooth N] [--width W] [--height H]\n"
    "  draws training curves from each run folder's metrics.jsonl (or a .jsonl file),\n"
    "  runs overlaid, one color each, named after the folder or the file stem.\n"
    "  --metric KEY  what to draw (default loss: train loss as a thin line with a\n"
    "                moving average, val_loss as markers); lr, grad_norm, val_ppl,\n"
    "                tokens_per_s, ... any numeric key of the lines, against step\n"
    "  --log-y       logarithmic y axis (values <= 0 are left out)\n"
    "  --smooth N    moving-average window over train-style lines (1 = none;\n"
    "                default about 2% of the points, for train loss only)\n"
    "  --width/--height  canvas size in pixels (default 900 x 540)\n"
    "  NaN and infinite values leave a gap in the line.";

int cmd_plot(int argc, char **argv) {
    whale_plot_opts opts = {0};
    const char *out = NULL;
    long smooth = 0, width = 0, height = 0;
    cli_args runs = {0};
    const cli_opt table[] = {
        {"-o|--out", CLI_STR, &out, 0, 0, NULL},
        {"--title", CLI_STR, &opts.title, 0, 0, NULL},
        {"--metric", CLI_STR, &opts.metric, 0, 0, NULL},
        {"--smooth", CLI_LONG, &smooth, 1, 1000000, NULL},
        {"--width", CLI_LONG, &width, 200, 20000, NULL},
        {"--height", CLI_LONG, &height, 150, 20000, NULL},
        {"--log-y", CLI_FLAG, &opts.log_y, 0, 0, NULL},
        {"RUN_OR_JSONL", CLI_ARGS, &runs, 0, 0, NULL},
        {NULL, 0, NULL, 0, 0, NULL},
    };
    int status = cli_parse("plot", plot_help, argc, argv, table, NULL, NULL);
    if (!status && runs.n == 0) status = cli_usage("plot", "give at least one run folder or .jsonl file");
    if (!status && !out) status = cli_usage("plot", "--out FILE.svg is required");
    if (!status && opts.metric && !opts.metric[0]) status = cli_usage("plot", "--metric needs a key name");
    if (status) {
        free(runs.v);
        return status < 0 ? 0 : status;
    }
    opts.smooth = (int)smooth, opts.width = (int)width, opts.height = (int)height;
    whale_err err;
    status = whale_plot_svg(runs.v, runs.n, &opts, out, &err) ? cli_fail(&err) : 0;
    free(runs.v);
    return status;
}
