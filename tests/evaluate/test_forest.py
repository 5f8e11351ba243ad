"""The forest plot: entries by mean, best on top, interval bars where the bootstrap put them,
the floor's line, the group letters on the right, the direction on the axis."""

import numpy as np

from captum_attnflow.evaluate import Leaderboard


def test_forest_plot_orders_by_mean_and_draws_intervals_floor_and_groups():
    rng = np.random.default_rng(1)
    values = {"good": 0.5 + rng.normal(0, 0.05, 40), "also good": 0.49 + rng.normal(0, 0.05, 40),
              "random": 0.1 + rng.normal(0, 0.05, 40), "bad": -0.2 + rng.normal(0, 0.05, 40)}
    board = Leaderboard.from_values({"sufficiency": {k: -v for k, v in values.items()}, "comprehensiveness": values}, n_resamples=199)
    figure = board.plot(floor="random")  # methods without layers: a forest plot
    for axes, metric in zip(figure.axes, ["sufficiency", "comprehensiveness"]):
        ranking = board.ranking(metric)
        labels = [label.get_text() for label in axes.get_yticklabels()]
        # sufficiency holds the negated values and lower is better: the same order
        assert sorted(labels[:2]) == ["also good", "good"] and labels[2:] == ["random", "bad"]
        means = [ranking.intervals[name].mean for name in labels]
        assert means == sorted(means, reverse=metric == "comprehensiveness")
        ticks = dict(zip(labels, axes.get_yticks()))
        assert ticks[labels[0]] > ticks[labels[-1]]  # best on top
        bars = {tuple(line.get_ydata()): line.get_xdata() for line in axes.lines if len(line.get_xdata()) == 2 and line.get_ydata()[0] == line.get_ydata()[1]}
        for name, y in ticks.items():
            interval = ranking.intervals[name]
            assert np.allclose(bars[(y, y)], [interval.low, interval.high])
        floor = [line for line in axes.lines if line.get_linestyle() == "--"]
        assert len(floor) == 1 and np.allclose(floor[0].get_xdata(), ranking.intervals["random"].mean)
        assert ("lower is better" if metric == "sufficiency" else "higher is better") in axes.get_xlabel()
        assert [text.get_text() for text in axes.texts] == [ranking.groups[name] for name in labels]
        assert [ranking.groups[name] for name in labels] == ["a", "a", "b", "c"]  # the two good ones share a group
    assert figure.get_size_inches()[0] * 100 == 1200


def test_per_layer_leaderboard_keeps_its_layer_axis():
    board = Leaderboard({("raw", "log-odds", 1): [-0.2, -0.4, -0.3], ("raw", "log-odds", 2): [-0.5, -0.1, -0.3]}, n_resamples=99)
    assert board.plot().axes[0].get_xlabel() == "layer"
    assert board.plot(kind="forest").axes[0].get_title() == "log-odds"
