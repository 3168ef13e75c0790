from memdpc.common.wording import duration_text, error_line, name_list, plural, size_text


def test_plural_counts_the_noun():
    assert [
        plural(1, "video"),
        plural(2, "video"),
        plural(3, "class"),
        plural(0, "shard"),
        plural(4, "batch"),
        plural(2, "epoch"),
        plural(9537, "video"),
    ] == ["1 video", "2 videos", "3 classes", "0 shards", "4 batches", "2 epochs", "9,537 videos"]


def test_name_list_counts_what_it_leaves_out():
    assert name_list(["a", "b"]) == "a, b"
    assert name_list([str(i) for i in range(13)], most=3) == "0, 1, 2 and 10 more"


def test_sizes_and_durations_read_in_the_largest_unit_that_fits():
    assert [size_text(n) for n in (512, 3_400_000, 1.2e9, 5e15)] == ["512 B", "3.4 MB", "1.2 GB", "5000.0 TB"]
    assert [duration_text(s) for s in (42, 420, 5 * 3600 + 12 * 60, 76 * 3600)] == [
        "42 s",
        "7 min",
        "5 h 12 min",
        "3 d 4 h",
    ]


def test_error_line_is_the_type_and_the_first_line_of_the_message():
    assert error_line(OSError("no such file\nmore detail")) == "OSError: no such file"
    assert error_line(RuntimeError("x" * 500), 10) == "RuntimeError: " + "x" * 10
    assert error_line(ValueError()) == "ValueError: "
