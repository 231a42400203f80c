"""The haystack family: tasks whose sample is a haystack with sentences inserted at depths, asked about in one greedy
answer (needle, mk-niah, mv-niah, vt, cwe, nolima).

The family shares one machinery: the options every haystack task takes (`options`), the sample with its inserts and
its fitting on the long-context toolkit (`samples`), the recipe contract with the generate loop, the up-front fit check
and the dry run's sizing (`recipe`), the answers table, depth grid and effective length (`tables`), the plots
(`plots`) and the viewer's prompt (`view`); `probes` builds the `Task` of a RULER or NoLiMa probe. Each task is a recipe
module that says how its sample is made and what its records and tables add.
"""
