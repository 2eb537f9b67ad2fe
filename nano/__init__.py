"""flint-nano (issue 11): a miniature Flint trained on a synthetic curriculum, so the default
chat and every engine path can be checked on a model that computes something real."""
