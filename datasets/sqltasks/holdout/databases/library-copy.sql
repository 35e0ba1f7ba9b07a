-- The same library schema with other rows: a second copy, so that an answer that matches the
-- first copy by luck (a hard-coded count, a name read off the sample rows) fails here.
CREATE TABLE Branches (BranchId INTEGER PRIMARY KEY, BranchName VARCHAR NOT NULL, District VARCHAR NOT NULL, OpenedYear INTEGER NOT NULL);
CREATE TABLE Members (MemberId INTEGER PRIMARY KEY, HomeBranchId INTEGER NOT NULL REFERENCES Branches(BranchId), FirstName VARCHAR NOT NULL, LastName VARCHAR NOT NULL, JoinedOn DATE NOT NULL, IsStudent BOOLEAN NOT NULL);
CREATE TABLE Books (BookId INTEGER PRIMARY KEY, Title VARCHAR NOT NULL, Author VARCHAR NOT NULL, Genre VARCHAR NOT NULL, PublishedYear INTEGER NOT NULL, Pages INTEGER NOT NULL);
CREATE TABLE Loans (LoanId INTEGER PRIMARY KEY, BookId INTEGER NOT NULL REFERENCES Books(BookId), MemberId INTEGER NOT NULL REFERENCES Members(MemberId), BranchId INTEGER NOT NULL REFERENCES Branches(BranchId), LoanedOn DATE NOT NULL, ReturnedOn DATE, LateFee DECIMAL(6,2) NOT NULL);
INSERT INTO Branches VALUES
  (1, 'Central', 'Old Town', 1958),
  (2, 'Canal Street', 'Harbour', 1991),
  (3, 'Hillcrest', 'Northgate', 2009);
INSERT INTO Members VALUES
  (1, 1, 'Jonah', 'Reyes', DATE '2020-04-17', TRUE),
  (2, 2, 'Keiko', 'Sato', DATE '2019-11-02', FALSE),
  (3, 2, 'Liam', 'Doyle', DATE '2023-08-21', TRUE),
  (4, 3, 'Maya', 'Brooks', DATE '2022-02-09', FALSE),
  (5, 3, 'Nikos', 'Pappas', DATE '2024-01-15', FALSE),
  (6, 1, 'Olga', 'Ivanova', DATE '2021-06-30', TRUE);
INSERT INTO Books VALUES
  (1, 'Harbour Lights', 'Tomas Berg', 'fiction', 2014, 276),
  (2, 'The Clockmaker', 'Sara Nyqvist', 'fiction', 2020, 398),
  (3, 'Roots of Rome', 'Tomas Berg', 'history', 2005, 610),
  (4, 'Mind the Gap', 'Irene Cole', 'science', 2018, 230),
  (5, 'Kitchen Chemistry', 'Irene Cole', 'home', 2016, 180),
  (6, 'The Lantern Fox', 'Sara Nyqvist', 'children', 2019, 40),
  (7, 'Deep Field', 'Ahmed Saleh', 'science', 2024, 312),
  (8, 'Stone Soup', 'Irene Cole', 'children', 2021, 36);
INSERT INTO Loans VALUES
  (1, 1, 1, 1, DATE '2024-02-03', DATE '2024-02-17', 0.00),
  (2, 3, 2, 2, DATE '2024-01-09', DATE '2024-02-20', 6.00),
  (3, 7, 2, 2, DATE '2024-04-02', NULL, 0.00),
  (4, 4, 3, 2, DATE '2024-03-11', DATE '2024-03-25', 0.00),
  (5, 2, 4, 3, DATE '2024-01-28', DATE '2024-03-02', 2.00),
  (6, 6, 5, 3, DATE '2024-03-19', NULL, 0.00),
  (7, 5, 6, 1, DATE '2024-02-22', DATE '2024-03-07', 0.00),
  (8, 2, 1, 2, DATE '2024-04-08', NULL, 0.00),
  (9, 3, 4, 3, DATE '2024-04-11', NULL, 0.00);
