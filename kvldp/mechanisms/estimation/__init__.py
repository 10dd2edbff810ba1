"""From counts to answers: standard errors (``variance``), the count model
(``countmodel``), post-processing (``postprocess``, ``consistency``,
``empirical_bayes``), confidence intervals (``intervals``), and the papers'
accuracy metrics against the truth (``metrics``, ``truth``)."""
