"""The Python side of elastic membership that needs no aggregator: request
checks of Client.update_membership and create_job(members=), and
member_since over JobInfo dicts written here by hand."""

import unittest

import syncnorm


def change(version, step, members, joined=(), left=(), removed=()):
    return {"version": version, "step": step, "members": list(members),
            "joined": list(joined), "left": list(left),
            "removed": list(removed)}


def job(history, world_size=6):
    return {"job_id": "net", "world_size": world_size,
            "membership": {"version": history[-1]["version"],
                           "members": history[-1]["members"],
                           "history": history}}


class MemberSinceTest(unittest.TestCase):

    def test_the_step_of_the_change_that_last_made_the_rank_a_member(self):
        info = job([change(0, 0, [0, 1, 2, 3]),
                    change(1, 7, [0, 1, 2], left=[3]),
                    change(2, 9, [0, 1, 2, 4], joined=[4]),
                    change(3, 12, [0, 1, 2, 3, 4], joined=[3])])
        self.assertEqual(syncnorm.member_since(info, 0), 0)
        self.assertEqual(syncnorm.member_since(info, 4), 9)
        self.assertEqual(syncnorm.member_since(info, 3), 12)
        self.assertIsNone(syncnorm.member_since(info, 5))
        with self.assertRaisesRegex(ValueError, "outside job 'net'"):
            syncnorm.member_since(info, 6)

    def test_int64_fields_may_come_as_strings_or_ints(self):
        info = job([change("4", "40", [1, 2], joined=[2])])
        self.assertEqual(syncnorm.member_since(info, 2), 40)
        self.assertEqual(syncnorm.member_since(info, 1), 0)


class RequestChecksTest(unittest.TestCase):
    """Bad requests fail before anything is sent (the address is never
    dialled)."""

    @classmethod
    def setUpClass(cls):
        cls.client = syncnorm.Client("127.0.0.1:1", rpc_timeout=0.5)

    def test_update_membership_says_what_is_wrong(self):
        cases = [
            (dict(join=[1], step=-1), "step to be an integer >= 0"),
            (dict(join=[1], step=1.5), "step to be an integer >= 0"),
            (dict(join=[-1]), r"join to be ranks \(integers >= 0\)"),
            (dict(leave=["2"]), r"leave to be ranks"),
            (dict(remove=[True]), r"remove to be ranks"),
            (dict(join=3), "join as a list of ranks"),
            (dict(join=[2, 2]), "rank 2 is named twice in join"),
            (dict(join=[2], leave=[2]), "rank 2 is named more than once"),
            (dict(), "expected ranks to join, leave or remove"),
        ]
        for kwargs, says in cases:
            with self.assertRaisesRegex(ValueError, says, msg=str(kwargs)):
                self.client.update_membership("net", **kwargs)

    def test_create_job_members_are_checked(self):
        spec = syncnorm.layer_spec("bn", 3)
        with self.assertRaisesRegex(ValueError, "at least one member"):
            self.client.create_job("net", 4, [spec], members=[])
        with self.assertRaisesRegex(ValueError, "rank 1 is named twice"):
            self.client.create_job("net", 4, [spec], members=[1, 1])
        with self.assertRaisesRegex(ValueError, "members to be ranks"):
            self.client.create_job("net", 4, [spec], members=[0, -2])

    def test_a_good_request_reaches_the_network(self):
        with self.assertRaises(syncnorm.ServiceError) as caught:
            self.client.update_membership("net", join=[1])
        self.assertEqual(caught.exception.code, "UNAVAILABLE")


if __name__ == "__main__":
    unittest.main()
