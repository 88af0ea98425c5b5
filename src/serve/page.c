/* GET /: the chat page, embedded (no files served from disk, nothing fetched from elsewhere). */
#include "serve/serve_impl.h"

const char serve_page_html[] = "<!doctype html><title>whale</title><p>whale serve</p>\n";
