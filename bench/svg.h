/* svg: hand-written SVG charts for the benchmarks, no libraries.
 *
 * Two chart kinds, each written to one self-contained .svg file that a browser opens:
 *   - svg_line_chart: series of (x, y) points drawn as lines (or as histogram steps), linear
 *     or log axes with ticks, axis labels, a title and a legend box;
 *   - svg_heatmap: a matrix of values (rows x columns) coloured on a log scale (viridis),
 *     each cell labelled with its value, labelled axes and a colour bar as the legend; a zero
 *     gets its own colour and a legend entry, a NaN is drawn as "n/a".
 * Functions return 0 on success, -1 if the file could not be written (errno says why). */
#ifndef PARITY_BENCH_SVG_H
#define PARITY_BENCH_SVG_H

#include <stddef.h>

typedef struct svg_axis {
    const char *label;  /* drawn along the axis */
    double lo, hi;      /* range; lo >= hi means: fit to the data */
    int log;            /* log10 scale (non-positive values are not drawn) */
} svg_axis;

typedef struct svg_series {
    const char *label;  /* legend text */
    const double *x, *y;
    size_t n;
    int steps;          /* draw as a histogram: x are bin left edges, x[n-1] ... x_end below */
    double x_end;       /* steps: right edge of the last bin */
    int dashed;
} svg_series;

int svg_line_chart(const char *path, const char *title, const char *subtitle, svg_axis x,
                   svg_axis y, const svg_series *series, size_t n_series);

typedef struct svg_heatmap_spec {
    const char *title, *subtitle;
    const char *row_axis, *col_axis;      /* axis labels, e.g. "sampler", "learner" */
    const char *scale_label;              /* colour bar label, e.g. "mean k3 KL" */
    const char *const *row_labels, *const *col_labels;
    size_t rows, cols;
    const double *values;                 /* rows x cols, row-major; NaN = no value */
    const char *zero_label;               /* the legend of a zero; NULL: bitwise-equal log-probs */
} svg_heatmap_spec;

int svg_heatmap(const char *path, const svg_heatmap_spec *spec);

#endif
