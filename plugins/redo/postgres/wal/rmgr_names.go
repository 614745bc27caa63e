package wal

// Code written from rmgrdesc's identify functions: record type names as pg_waldump prints them.

var recordNames = [RmMax + 1][16]string{
	RmXLOG: {
		0x0: "CHECKPOINT_SHUTDOWN",
		0x1: "CHECKPOINT_ONLINE",
		0x2: "NOOP",
		0x3: "NEXTOID",
		0x4: "SWITCH",
		0x5: "BACKUP_END",
		0x6: "PARAMETER_CHANGE",
		0x7: "RESTORE_POINT",
		0x8: "FPW_CHANGE",
		0x9: "END_OF_RECOVERY",
		0xA: "FPI_FOR_HINT",
		0xB: "FPI",
		0xD: "OVERWRITE_CONTRECORD",
	},
	RmXact: {
		0x0: "COMMIT",
		0x1: "PREPARE",
		0x2: "ABORT",
		0x3: "COMMIT_PREPARED",
		0x4: "ABORT_PREPARED",
		0x5: "ASSIGNMENT",
		0x6: "INVALIDATION",
	},
	RmSmgr: {
		0x1: "CREATE",
		0x2: "TRUNCATE",
	},
	RmCLOG: {
		0x0: "ZEROPAGE",
		0x1: "TRUNCATE",
	},
	RmDatabase: {
		0x0: "CREATE_FILE_COPY",
		0x1: "CREATE_WAL_LOG",
		0x2: "DROP",
	},
	RmTablespace: {
		0x0: "CREATE",
		0x1: "DROP",
	},
	RmMultiXact: {
		0x0: "ZERO_OFF_PAGE",
		0x1: "ZERO_MEM_PAGE",
		0x2: "CREATE_ID",
		0x3: "TRUNCATE_ID",
	},
	RmRelMap: {
		0x0: "UPDATE",
	},
	RmStandby: {
		0x0: "LOCK",
		0x1: "RUNNING_XACTS",
		0x2: "INVALIDATIONS",
	},
	RmHeap2: {
		0x0: "REWRITE",
		0x1: "PRUNE",
		0x2: "VACUUM",
		0x3: "FREEZE_PAGE",
		0x4: "VISIBLE",
		0x5: "MULTI_INSERT",
		0x6: "LOCK_UPDATED",
		0x7: "NEW_CID",
		0xD: "MULTI_INSERT+INIT",
	},
	RmHeap: {
		0x0: "INSERT",
		0x1: "DELETE",
		0x2: "UPDATE",
		0x3: "TRUNCATE",
		0x4: "HOT_UPDATE",
		0x5: "HEAP_CONFIRM",
		0x6: "LOCK",
		0x7: "INPLACE",
		0x8: "INSERT+INIT",
		0xA: "UPDATE+INIT",
		0xC: "HOT_UPDATE+INIT",
	},
	RmBtree: {
		0x0: "INSERT_LEAF",
		0x1: "INSERT_UPPER",
		0x2: "INSERT_META",
		0x3: "SPLIT_L",
		0x4: "SPLIT_R",
		0x5: "INSERT_POST",
		0x6: "DEDUP",
		0x7: "DELETE",
		0x8: "UNLINK_PAGE",
		0x9: "UNLINK_PAGE_META",
		0xA: "NEWROOT",
		0xB: "MARK_PAGE_HALFDEAD",
		0xC: "VACUUM",
		0xD: "REUSE_PAGE",
		0xE: "META_CLEANUP",
	},
	RmHash: {
		0x0: "INIT_META_PAGE",
		0x1: "INIT_BITMAP_PAGE",
		0x2: "INSERT",
		0x3: "ADD_OVFL_PAGE",
		0x4: "SPLIT_ALLOCATE_PAGE",
		0x5: "SPLIT_PAGE",
		0x6: "SPLIT_COMPLETE",
		0x7: "MOVE_PAGE_CONTENTS",
		0x8: "SQUEEZE_PAGE",
		0x9: "DELETE",
		0xA: "SPLIT_CLEANUP",
		0xB: "UPDATE_META_PAGE",
		0xC: "VACUUM_ONE_PAGE",
	},
	RmGin: {
		0x1: "CREATE_PTREE",
		0x2: "INSERT",
		0x3: "SPLIT",
		0x4: "VACUUM_PAGE",
		0x5: "DELETE_PAGE",
		0x6: "UPDATE_META_PAGE",
		0x7: "INSERT_LISTPAGE",
		0x8: "DELETE_LISTPAGE",
		0x9: "VACUUM_DATA_LEAF_PAGE",
	},
	RmGist: {
		0x0: "PAGE_UPDATE",
		0x1: "DELETE",
		0x2: "PAGE_REUSE",
		0x3: "PAGE_SPLIT",
		0x6: "PAGE_DELETE",
		0x7: "ASSIGN_LSN",
	},
	RmSequence: {
		0x0: "LOG",
	},
	RmSPGist: {
		0x1: "ADD_LEAF",
		0x2: "MOVE_LEAFS",
		0x3: "ADD_NODE",
		0x4: "SPLIT_TUPLE",
		0x5: "PICKSPLIT",
		0x6: "VACUUM_LEAF",
		0x7: "VACUUM_ROOT",
		0x8: "VACUUM_REDIRECT",
	},
	RmBRIN: {
		0x0: "CREATE_INDEX",
		0x1: "INSERT",
		0x2: "UPDATE",
		0x3: "SAMEPAGE_UPDATE",
		0x4: "REVMAP_EXTEND",
		0x5: "DESUMMARIZE",
		0x9: "INSERT+INIT",
		0xA: "UPDATE+INIT",
	},
	RmCommitTs: {
		0x0: "ZEROPAGE",
		0x1: "TRUNCATE",
	},
	RmReplicationOrigin: {
		0x0: "SET",
		0x1: "DROP",
	},
	RmGeneric: {
		0x0: "Generic",
		0x1: "Generic",
		0x2: "Generic",
		0x3: "Generic",
		0x4: "Generic",
		0x5: "Generic",
		0x6: "Generic",
		0x7: "Generic",
		0x8: "Generic",
		0x9: "Generic",
		0xA: "Generic",
		0xB: "Generic",
		0xC: "Generic",
		0xD: "Generic",
		0xE: "Generic",
		0xF: "Generic",
	},
	RmLogicalMessage: {
		0x0: "MESSAGE",
	},
}

// Identify returns the record type name that pg_waldump prints for info
// (the high four bits of xl_info) of resource manager rm, such as
// "INSERT+INIT"; ok is false for combinations Postgres does not define.
func Identify(rm RmgrID, info uint8) (name string, ok bool) {
	if rm > RmMax {
		return "", false
	}
	i := info >> 4
	if rm == RmXact {
		i &= 0x07
	}
	n := recordNames[rm][i]
	return n, n != ""
}
