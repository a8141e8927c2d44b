"""
The attention explorer: one room for its analysis, its server and its page.
explore.py is only the launcher (options, the model, the port).

    interpret.py     the causal questions, by hooks on model.py's modules: the logit
                     lens, direct logit attribution, activation patching
    server.py        the local HTTP server and its JSON API: Explorer answers each
                     request, for the loaded model or one of the run's snapshots
    live.py          a training run as it is being written: the timeline of its
                     evaluations and snapshots, and a version that says what changed
    page/            index.html and explorer.css; explorer.js (the state, the heads
                     view, the step slider), panels.js (why, patching, exports),
                     timeline.js (live follow, the timeline, play, composition)

A panel of the page is made of four pieces, one in each place:

1. the analysis key: a field of the answer that Explorer.analysis() builds in
   server.py (with the request fields it accepts in ANALYZE_FIELDS, or an
   endpoint and field set of its own, as /api/patch has PATCH_FIELDS);
2. the render function in page/*.js that draws that field (renderWhy draws
   "why", renderLens draws "lens"), called from render();
3. the view entry: the panel's name in VIEWS, which the tabs and the ?view=
   address read (panels shown together share one view);
4. the section in page/index.html, `<section data-view="NAME">`, holding the
   elements the render function fills.

A new panel adds one of each, and a test that compares its numbers in the
answer with the computation called directly (tests/test_explore*.py).
"""
