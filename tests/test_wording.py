from memdpc.wording import name_list, plural


def test_plural_counts_the_noun():
    assert [plural(1, "video"), plural(2, "video"), plural(3, "class"), plural(0, "shard")] == [
        "1 video", "2 videos", "3 classes", "0 shards"]


def test_name_list_counts_what_it_leaves_out():
    assert name_list(["a", "b"]) == "a, b"
    assert name_list([str(i) for i in range(13)], most=3) == "0, 1, 2 and 10 more"
