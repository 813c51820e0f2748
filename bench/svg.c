/* svg: hand-written SVG charts (see svg.h). Coordinates are in user units (pixels at 100%);
 * text is escaped for XML; every file carries its own <title> and style. */
#include "svg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FONT "font-family=\"Helvetica, Arial, sans-serif\""

/* ---------------------------------------------------------------------------------------- */
/* Low-level writing                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Writes `s` with the five XML special characters escaped. */
static void put_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* <text> at (x, y); anchor is start|middle|end; rotate in degrees about (x, y). */
__attribute__((format(printf, 8, 9)))
static void text_at(FILE *f, double x, double y, const char *anchor, double size, double rotate,
                    const char *weight, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%.1f\" " FONT,
            x, y, anchor, size);
    if (weight) fprintf(f, " font-weight=\"%s\"", weight);
    if (rotate != 0.0) fprintf(f, " transform=\"rotate(%.1f %.1f %.1f)\"", rotate, x, y);
    fputc('>', f);
    put_escaped(f, buf);
    fputs("</text>\n", f);
}

static void line_at(FILE *f, double x1, double y1, double x2, double y2, const char *colour,
                    double width) {
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
               "stroke-width=\"%.2f\"/>\n", x1, y1, x2, y2, colour, width);
}

static void rect_at(FILE *f, double x, double y, double w, double h, const char *fill,
                    const char *stroke) {
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"", x, y,
            w, h, fill);
    if (stroke) fprintf(f, " stroke=\"%s\" stroke-width=\"1\"", stroke);
    fputs("/>\n", f);
}

static FILE *open_document(const char *path, double w, double h, const char *title) {
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\">\n<title>", w, h, w, h);
    put_escaped(f, title);
    fputs("</title>\n", f);
    rect_at(f, 0, 0, w, h, "white", NULL);
    return f;
}

static int close_document(FILE *f) {
    fputs("</svg>\n", f);
    int bad = ferror(f);
    return (fclose(f) || bad) ? -1 : 0;
}

/* A palette that stays distinguishable in print (Tableau 10). */
static const char *series_colour(size_t i) {
    static const char *const c[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    return c[i % (sizeof c / sizeof c[0])];
}

/* Viridis, linear between five anchors; t in [0, 1]. */
static void viridis(double t, char out[8]) {
    static const unsigned char a[5][3] = {
        {0x44, 0x01, 0x54}, {0x3b, 0x52, 0x8b}, {0x21, 0x91, 0x8c}, {0x5e, 0xc9, 0x62},
        {0xfd, 0xe7, 0x25}};
    if (!(t > 0)) t = 0;
    if (t > 1) t = 1;
    double s = t * 4;
    int i = s >= 4 ? 3 : (int)s;
    double u = s - i;
    int rgb[3];
    for (int k = 0; k < 3; k++) rgb[k] = (int)lround(a[i][k] + u * (a[i + 1][k] - a[i][k]));
    snprintf(out, 8, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
}

/* ---------------------------------------------------------------------------------------- */
/* Axes                                                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct scale {
    double lo, hi;      /* data range (log10 of it on a log axis) */
    double p0, p1;      /* pixel range */
    int log;
} scale;

static int drawable(const scale *s, double v) { return isfinite(v) && (!s->log || v > 0); }

static double to_pixel(const scale *s, double v) {
    double u = s->log ? log10(v) : v;
    return s->p0 + (u - s->lo) / (s->hi - s->lo) * (s->p1 - s->p0);
}

/* A 1-2-5 step giving about `want` intervals over [lo, hi]. */
static double nice_step(double lo, double hi, int want) {
    double raw = (hi - lo) / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return mag * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

/* The range of an axis: given, or fitted to the data (decades on a log axis, 1-2-5 steps on
 * a linear one). */
static void fit_scale(scale *s, const svg_axis *a, const svg_series *series, size_t n_series,
                      int along_x) {
    s->log = a->log;
    double lo = INFINITY, hi = -INFINITY;
    if (a->lo < a->hi) {
        lo = a->lo;
        hi = a->hi;
    } else {
        for (size_t i = 0; i < n_series; i++)
            for (size_t k = 0; k < series[i].n; k++) {
                double v = along_x ? series[i].x[k] : series[i].y[k];
                if (!isfinite(v) || (a->log && v <= 0)) continue;
                if (v < lo) lo = v;
                if (v > hi) hi = v;
                if (along_x && series[i].steps && k + 1 == series[i].n && series[i].x_end > hi)
                    hi = series[i].x_end;
            }
        if (!(lo <= hi)) lo = hi = a->log ? 1 : 0;
    }
    if (a->log) {
        s->lo = floor(log10(lo));
        s->hi = ceil(log10(hi));
        if (s->hi <= s->lo) s->hi = s->lo + 1;
    } else if (a->lo < a->hi) {
        s->lo = lo;
        s->hi = hi;
    } else {
        if (lo == hi) {
            lo -= 1;
            hi += 1;
        }
        double step = nice_step(lo, hi, 5);
        s->lo = floor(lo / step) * step;
        s->hi = ceil(hi / step) * step;
    }
}

/* Tick values of an axis, at most `max`; returns the count. */
static size_t ticks_of(const scale *s, double *out, size_t max) {
    size_t n = 0;
    if (s->log) {
        int decades = (int)(s->hi - s->lo), every = decades > 8 ? 2 : 1;
        for (int d = (int)s->lo; d <= (int)s->hi && n < max; d += every) {
            out[n++] = pow(10, d);
            if (decades <= 2 && d < (int)s->hi && n + 2 <= max) {
                out[n++] = 2 * pow(10, d);
                out[n++] = 5 * pow(10, d);
            }
        }
    } else {
        double step = nice_step(s->lo, s->hi, 5);
        for (double v = ceil(s->lo / step - 1e-9) * step; v <= s->hi + step * 1e-9 && n < max;
             v += step)
            out[n++] = fabs(v) < step * 1e-9 ? 0 : v;
    }
    return n;
}

static void draw_axes(FILE *f, const scale *sx, const scale *sy, const svg_axis *ax,
                      const svg_axis *ay) {
    double t[40];
    size_t n = ticks_of(sx, t, 40);
    for (size_t i = 0; i < n; i++) {
        double px = to_pixel(sx, t[i]);
        line_at(f, px, sy->p0, px, sy->p1, "#e6e6e6", 1);
        line_at(f, px, sy->p0, px, sy->p0 + 5, "black", 1);
        text_at(f, px, sy->p0 + 18, "middle", 11, 0, NULL, "%g", t[i]);
    }
    n = ticks_of(sy, t, 40);
    for (size_t i = 0; i < n; i++) {
        double py = to_pixel(sy, t[i]);
        line_at(f, sx->p0, py, sx->p1, py, "#e6e6e6", 1);
        line_at(f, sx->p0 - 5, py, sx->p0, py, "black", 1);
        text_at(f, sx->p0 - 8, py + 4, "end", 11, 0, NULL, "%g", t[i]);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"black\" stroke-width=\"1\"/>\n",
            sx->p0, sy->p1, sx->p1 - sx->p0, sy->p0 - sy->p1);
    text_at(f, (sx->p0 + sx->p1) / 2, sy->p0 + 42, "middle", 14, 0, NULL, "%s%s", ax->label,
            ax->log ? " (log scale)" : "");
    text_at(f, sx->p0 - 62, (sy->p0 + sy->p1) / 2, "middle", 14, -90, NULL, "%s%s", ay->label,
            ay->log ? " (log scale)" : "");
}

/* ---------------------------------------------------------------------------------------- */
/* Line chart                                                                               */
/* ---------------------------------------------------------------------------------------- */

static void draw_steps(FILE *f, const scale *sx, const scale *sy, const svg_series *s,
                       const char *colour) {
    fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s d=\"", colour,
            s->dashed ? " stroke-dasharray=\"6 3\"" : "");
    for (size_t k = 0; k < s->n; k++) {
        double y = drawable(sy, s->y[k]) ? to_pixel(sy, s->y[k]) : sy->p0;
        if (y > sy->p0) y = sy->p0;
        double x0 = to_pixel(sx, s->x[k]);
        double x1 = to_pixel(sx, k + 1 < s->n ? s->x[k + 1] : s->x_end);
        fprintf(f, k ? " L%.1f %.1f" : "M%.1f %.1f", x0, y);
        fprintf(f, " L%.1f %.1f", x1, y);
    }
    fputs("\"/>\n", f);
}

/* Lines between drawable consecutive points, and a marker at every drawable point. */
static void draw_line(FILE *f, const scale *sx, const scale *sy, const svg_series *s,
                      const char *colour) {
    int open = 0;
    for (size_t k = 0; k < s->n; k++) {
        if (!drawable(sx, s->x[k]) || !drawable(sy, s->y[k])) {
            if (open) fputs("\"/>\n", f);
            open = 0;
            continue;
        }
        double x = to_pixel(sx, s->x[k]), y = to_pixel(sy, s->y[k]);
        if (!open)
            fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s d=\"M%.1f %.1f",
                    colour, s->dashed ? " stroke-dasharray=\"6 3\"" : "", x, y);
        else
            fprintf(f, " L%.1f %.1f", x, y);
        open = 1;
    }
    if (open) fputs("\"/>\n", f);
    for (size_t k = 0; k < s->n; k++)
        if (drawable(sx, s->x[k]) && drawable(sy, s->y[k]))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    to_pixel(sx, s->x[k]), to_pixel(sy, s->y[k]), colour);
}

/* True if a series has nothing to draw on this scale (all values zero on a log axis). */
static int series_invisible(const scale *sy, const svg_series *s) {
    for (size_t k = 0; k < s->n; k++)
        if (drawable(sy, s->y[k])) return 0;
    return 1;
}

static void draw_legend(FILE *f, double x, double y, const scale *sy, const svg_series *series,
                        size_t n) {
    double h = 24 + 18.0 * (double)n;
    rect_at(f, x, y, 300, h, "white", "#999999");
    text_at(f, x + 10, y + 16, "start", 12, 0, "bold", "legend");
    for (size_t i = 0; i < n; i++) {
        double ly = y + 32 + 18.0 * (double)i;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2.5\"%s/>\n", x + 10, ly - 4, x + 36, ly - 4,
                series_colour(i), series[i].dashed ? " stroke-dasharray=\"6 3\"" : "");
        int hidden = !series[i].steps && series_invisible(sy, &series[i]);
        text_at(f, x + 42, ly, "start", 11, 0, NULL, "%s%s", series[i].label,
                hidden ? " (all 0: not drawn)" : "");
    }
}

int svg_line_chart(const char *path, const char *title, const char *subtitle, svg_axis x,
                   svg_axis y, const svg_series *series, size_t n_series) {
    const double W = 980, H = 560;
    double legend_h = 24 + 18.0 * (double)n_series;
    double height = H > legend_h + 120 ? H : legend_h + 120;
    FILE *f = open_document(path, W, height, title);
    if (!f) return -1;
    scale sx = {0}, sy = {0};
    fit_scale(&sx, &x, series, n_series, 1);
    fit_scale(&sy, &y, series, n_series, 0);
    sx.p0 = 90;
    sx.p1 = 640;
    sy.p0 = height - 80;
    sy.p1 = 70;
    text_at(f, W / 2, 26, "middle", 17, 0, "bold", "%s", title);
    if (subtitle) text_at(f, W / 2, 46, "middle", 12, 0, NULL, "%s", subtitle);
    draw_axes(f, &sx, &sy, &x, &y);
    for (size_t i = 0; i < n_series; i++) {
        if (series[i].steps) draw_steps(f, &sx, &sy, &series[i], series_colour(i));
        else draw_line(f, &sx, &sy, &series[i], series_colour(i));
    }
    draw_legend(f, 665, 70, &sy, series, n_series);
    return close_document(f);
}

/* ---------------------------------------------------------------------------------------- */
/* Heatmap                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* The log10 range of the positive values, widened to whole decades. */
static void positive_decades(const double *v, size_t n, double *lo, double *hi) {
    double a = INFINITY, b = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (isfinite(v[i]) && v[i] > 0) {
            if (v[i] < a) a = v[i];
            if (v[i] > b) b = v[i];
        }
    if (!(a <= b)) a = b = 1;
    *lo = floor(log10(a));
    *hi = ceil(log10(b));
    if (*hi <= *lo) *hi = *lo + 1;
}

static void draw_colour_bar(FILE *f, double x, double y, double h, double lo, double hi,
                            const svg_heatmap_spec *sp, int has_zero, int has_nan) {
    fputs("<defs><linearGradient id=\"viridis\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n", f);
    for (int i = 0; i <= 8; i++) {
        char c[8];
        viridis(i / 8.0, c);
        fprintf(f, "<stop offset=\"%.3f\" stop-color=\"%s\"/>\n", i / 8.0, c);
    }
    fputs("</linearGradient></defs>\n", f);
    text_at(f, x, y - 12, "start", 12, 0, "bold", "legend: %s (log scale)", sp->scale_label);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"22\" height=\"%.1f\" fill=\"url(#viridis)\" "
               "stroke=\"black\"/>\n", x, y, h);
    for (int d = (int)lo; d <= (int)hi; d++) {
        double py = y + h - (d - lo) / (hi - lo) * h;
        line_at(f, x + 22, py, x + 28, py, "black", 1);
        text_at(f, x + 32, py + 4, "start", 11, 0, NULL, "1e%d", d);
    }
    double sy = y + h + 20;
    if (has_zero) {
        rect_at(f, x, sy, 22, 16, "#f2f2f2", "black");
        text_at(f, x + 30, sy + 12, "start", 11, 0, NULL, "%s",
                sp->zero_label ? sp->zero_label : "0 (bitwise-equal log-probs)");
        sy += 24;
    }
    if (has_nan) {
        rect_at(f, x, sy, 22, 16, "white", "#bbbbbb");
        text_at(f, x + 30, sy + 12, "start", 11, 0, NULL, "n/a (not measured)");
    }
}

static void draw_cell(FILE *f, double x, double y, double w, double h, double v, double lo,
                      double hi) {
    if (!isfinite(v)) {
        rect_at(f, x, y, w, h, "white", "#bbbbbb");
        text_at(f, x + w / 2, y + h / 2 + 4, "middle", 10, 0, NULL, "n/a");
        return;
    }
    if (v <= 0) {
        rect_at(f, x, y, w, h, "#f2f2f2", "white");
        text_at(f, x + w / 2, y + h / 2 + 4, "middle", 11, 0, NULL, "0");
        return;
    }
    double t = (log10(v) - lo) / (hi - lo);
    char c[8];
    viridis(t, c);
    rect_at(f, x, y, w, h, c, "white");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" " FONT
               " fill=\"%s\">%.1e</text>\n", x + w / 2, y + h / 2 + 4, t < 0.6 ? "white" : "black",
            v);
}

int svg_heatmap(const char *path, const svg_heatmap_spec *sp) {
    /* room for the longest row label (11 px text, about 6.2 px a character) and the legend's
     * title (12 px bold, about 7.2) */
    size_t longest = 0;
    for (size_t r = 0; r < sp->rows; r++)
        if (strlen(sp->row_labels[r]) > longest) longest = strlen(sp->row_labels[r]);
    const double cw = 78, ch = 30, top = 80, left = fmax(230, 48 + 6.2 * (double)longest);
    const double legend_w = fmax(290, 60 + 7.2 * (double)(strlen(sp->scale_label) + 21));
    double grid_w = cw * (double)sp->cols, grid_h = ch * (double)sp->rows;
    double W = left + grid_w + legend_w, H = top + grid_h + 130;
    if (H < 420) H = 420;
    FILE *f = open_document(path, W, H, sp->title);
    if (!f) return -1;
    size_t n = sp->rows * sp->cols;
    double lo, hi;
    positive_decades(sp->values, n, &lo, &hi);
    int has_zero = 0, has_nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(sp->values[i])) has_nan = 1;
        else if (sp->values[i] <= 0) has_zero = 1;
    }
    text_at(f, W / 2, 26, "middle", 17, 0, "bold", "%s", sp->title);
    if (sp->subtitle) text_at(f, W / 2, 46, "middle", 12, 0, NULL, "%s", sp->subtitle);
    for (size_t r = 0; r < sp->rows; r++) {
        double y = top + ch * (double)r;
        text_at(f, left - 8, y + ch / 2 + 4, "end", 11, 0, NULL, "%s", sp->row_labels[r]);
        for (size_t c = 0; c < sp->cols; c++)
            draw_cell(f, left + cw * (double)c, y, cw, ch, sp->values[r * sp->cols + c], lo, hi);
    }
    for (size_t c = 0; c < sp->cols; c++) {
        double x = left + cw * ((double)c + 0.5), y = top + grid_h + 12;
        text_at(f, x, y, "end", 11, -35, NULL, "%s", sp->col_labels[c]);
    }
    text_at(f, left + grid_w / 2, top + grid_h + 105, "middle", 14, 0, "bold", "%s", sp->col_axis);
    text_at(f, 24, top + grid_h / 2, "middle", 14, -90, "bold", "%s", sp->row_axis);
    draw_colour_bar(f, left + grid_w + 40, top + 10, grid_h > 200 ? grid_h - 60 : 160, lo, hi,
                    sp, has_zero, has_nan);
    return close_document(f);
}
